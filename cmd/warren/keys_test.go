package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/store"
)

// --team makes another team's keys, and list and revoke stay inside the
// team they name.
func TestKeysTeam(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// The data dir first: flags after an argument are not read, and
	// this must never fall back to the default data dir.
	keys := func(cmd string, args ...string) error {
		return runKeys(ctx, append([]string{cmd, "--data-dir", dir}, args...))
	}
	if err := keys("create", "--team", "other-team", "--name", "o"); err != nil {
		t.Fatal(err)
	}
	if err := keys("create", "--team", "other-team"); err != nil {
		t.Fatalf("a second key of an existing team: %v", err)
	}
	for _, bad := range []string{"", "Other", "a/b", "x y", string(make([]byte, 65))} {
		if err := keys("create", "--team", bad); err == nil {
			t.Errorf("--team %q was taken", bad)
		}
	}

	s, err := store.Open(ctx, filepath.Join(dir, "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.GetTeam(ctx, "other-team"); err != nil {
		t.Fatalf("the team was not made: %v", err)
	}
	other, err := s.ListKeys(ctx, "other-team")
	if err != nil || len(other) != 2 {
		t.Fatalf("other-team's keys: %v, %v", other, err)
	}
	def, err := s.ListKeys(ctx, auth.DefaultTeamID)
	if err != nil || len(def) != 2 { // the initial API key and access token
		t.Fatalf("the default team's keys: %v, %v", def, err)
	}
	if err := keys("revoke", other[0].ID); err == nil {
		t.Error("the default team revoked another team's key")
	}
	if err := keys("revoke", "--team", "other-team", other[0].ID); err != nil {
		t.Fatal(err)
	}
	if left, _ := s.ListKeys(ctx, "other-team"); len(left) != 1 || left[0].ID != other[1].ID {
		t.Errorf("after the revoke, other-team has %v", left)
	}
}

// Arguments out of place are refused before any store is opened: `keys
// revoke ID --data-dir DIR` leaves the flag unread, and must not open (or
// make) the store of the default data dir instead.
func TestKeysArgsCheckedFirst(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"list", "--data-dir", dir, "stray"},
		{"create", "--data-dir", dir, "stray"},
		{"revoke", "--data-dir", dir},
		{"revoke", "--data-dir", dir, "a", "b"},
		{"nosuch", "--data-dir", dir},
	} {
		if err := runKeys(ctx, args); err == nil {
			t.Errorf("keys %v: no error", args)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "warren.db")); !os.IsNotExist(err) {
		t.Errorf("a refused command opened the store: %v", err)
	}
}
