package auth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/warren-sandbox/warren/internal/store"
)

func newStore(t *testing.T) (store.Store, string) {
	dir := t.TempDir()
	s, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

func TestBootstrapOnceThenAuthenticate(t *testing.T) {
	ctx := context.Background()
	s, dir := newStore(t)
	c, err := Bootstrap(ctx, s, dir, "", "")
	if err != nil || c == nil {
		t.Fatalf("first Bootstrap: %v %v", c, err)
	}
	if !strings.HasPrefix(c.APIKey, "e2b_") || len(c.APIKey) != 44 || !strings.HasPrefix(c.AccessToken, "sk_e2b_") {
		t.Errorf("credentials %+v", c)
	}
	fi, err := os.Stat(c.File)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("credentials file: %v %v", fi, err)
	}
	body, _ := os.ReadFile(c.File)
	if !strings.Contains(string(body), c.APIKey) || !strings.Contains(string(body), c.AccessToken) {
		t.Errorf("credentials file content %q", body)
	}
	if again, err := Bootstrap(ctx, s, dir, "", ""); err != nil || again != nil {
		t.Errorf("second Bootstrap: %v %v", again, err)
	}
	if k, err := Authenticate(ctx, s, store.KindAPIKey, c.APIKey); err != nil || k.TeamID != DefaultTeamID {
		t.Errorf("API key: %+v %v", k, err)
	}
	if _, err := Authenticate(ctx, s, store.KindAccessToken, c.APIKey); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("API key as access token: %v", err)
	}
	if _, err := Authenticate(ctx, s, store.KindAPIKey, "e2b_"+strings.Repeat("0", 40)); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("unknown key: %v", err)
	}
	// Only hashes are stored.
	keys, _ := s.ListKeys(ctx, DefaultTeamID)
	for _, k := range keys {
		if k.Hash == c.APIKey || k.Hash == c.AccessToken || strings.Contains(k.Mask, c.APIKey[8:30]) {
			t.Errorf("secret stored in clear: %+v", k)
		}
	}
}

func TestPresetCredentials(t *testing.T) {
	ctx := context.Background()
	s, dir := newStore(t)
	key := "e2b_" + strings.Repeat("a", 40)
	tok := "sk_e2b_" + strings.Repeat("b", 40)
	c, err := Bootstrap(ctx, s, dir, key, tok)
	if err != nil || c.APIKey != key || c.AccessToken != tok {
		t.Fatalf("preset: %+v %v", c, err)
	}
	// A preset added on a later start works too.
	key2 := "e2b_" + strings.Repeat("c", 40)
	if _, err := Bootstrap(ctx, s, dir, key2, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Authenticate(ctx, s, store.KindAPIKey, key2); err != nil {
		t.Errorf("later preset: %v", err)
	}
	if _, err := Bootstrap(ctx, s, dir, "not-a-key", ""); err == nil {
		t.Error("a malformed preset was accepted")
	}
}

func TestKeysAreUUIDsMaskedAsE2BsAndBounded(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	if err := s.CreateTeam(ctx, store.Team{ID: "t", Name: "t"}); err != nil {
		t.Fatal(err)
	}
	k, secret, err := CreateKey(ctx, s, "t", store.KindAPIKey, "ci", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := uuid.Parse(k.ID); err != nil || len(k.ID) != 36 {
		t.Errorf("ID %q is not a UUID: %v", k.ID, err)
	}
	m := MaskOf(k)
	rest := strings.TrimPrefix(secret, APIKeyPrefix)
	want := Masked{Prefix: "e2b_", ValueLength: 40, First: rest[:2], Last: rest[36:]}
	if m != want {
		t.Errorf("MaskOf = %+v, want %+v", m, want)
	}
	// A preset too short for a mask shows nothing of itself.
	short := store.Key{Kind: store.KindAPIKey, Mask: Mask("e2b_abcdef")}
	if m := MaskOf(short); m.First != "" || m.Last != "" {
		t.Errorf("short key's mask shows %+v", m)
	}
	// The team's bound counts both kinds.
	for i := 1; i < MaxTeamKeys; i++ {
		if err := s.CreateKey(ctx, store.Key{ID: fmt.Sprint(i), TeamID: "t", Kind: store.KindAccessToken, Hash: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := CreateKey(ctx, s, "t", store.KindAPIKey, "one too many", ""); !errors.Is(err, ErrTooManyKeys) {
		t.Errorf("key past MaxTeamKeys: %v", err)
	}
}
