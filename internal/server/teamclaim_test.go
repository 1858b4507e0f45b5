package server

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// A node claims a place in the store for its resumes on traffic, against
// its --max-sandboxes-per-team; a single server's own count is enough.
func TestNodeReservesTrafficResumesInTheStore(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateTeam(ctx, store.Team{ID: "t1", Name: "t1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{{Role: RoleAll, MaxPerTeam: 1}, {Role: RoleNode}} {
		if reserveForTeam(cfg, st, nil) != nil {
			t.Errorf("%s with a limit of %d reserves in the store", cfg.Role, cfg.MaxPerTeam)
		}
	}
	reserve := reserveForTeam(Config{Role: RoleNode, MaxPerTeam: 1}, st, nil)
	if reserve == nil {
		t.Fatal("a node with a limit reserves nothing")
	}
	release, err := reserve(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reserve(ctx, "t1"); !errors.Is(err, sandbox.ErrTeamLimit) {
		t.Errorf("a second place with a limit of 1: %v", err)
	}
	release()
	if _, err := reserve(ctx, "t1"); err != nil {
		t.Errorf("a place given back is free: %v", err)
	}
	if _, err := reserve(ctx, ""); err == nil {
		t.Error("a place for no team")
	}
}
