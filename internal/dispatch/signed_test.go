package dispatch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/filesig"
	"github.com/warren-sandbox/warren/internal/store"
)

// countingStore counts the sandbox reads a Dispatcher makes, and the
// rows they return.
type countingStore struct {
	store.Store
	mu          sync.Mutex
	reads, rows int
}

func (c *countingStore) add(rows int) {
	c.mu.Lock()
	c.reads++
	c.rows += rows
	c.mu.Unlock()
}

func (c *countingStore) take() (reads, rows int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	reads, rows = c.reads, c.rows
	c.reads, c.rows = 0, 0
	return reads, rows
}

func (c *countingStore) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, error) {
	sbs, err := c.Store.ListSandboxes(ctx, f)
	c.add(len(sbs))
	return sbs, err
}

func (c *countingStore) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := c.Store.GetSandbox(ctx, id)
	c.add(1)
	return sb, err
}

func (c *countingStore) SandboxRoutes(ctx context.Context, seq int64) ([]store.SandboxRoute, int64, error) {
	rs, next, err := c.Store.SandboxRoutes(ctx, seq)
	c.add(len(rs))
	return rs, next, err
}

// TestSignedURLGuessesCostO1StoreWork: an unauthenticated signed-URL
// guess must not make the api read every sandbox row of the cluster.
// Figures: go test -count=1 -v -run TestSignedURLGuessesCostO1StoreWork ./internal/dispatch/
func TestSignedURLGuessesCostO1StoreWork(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	cs := &countingStore{Store: c.st}
	cfg := c.d.cfg
	cfg.Store = cs
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const sandboxes, guesses = 1000, 400
	for i := range sandboxes {
		id := fmt.Sprintf("sbx%04d", i)
		rec := store.Sandbox{ID: id, TeamID: "t1", TemplateID: "base", State: store.StateRunning, Node: "na",
			StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour), EnvdAccessToken: "envd-" + id}
		if err := c.st.CreateSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	signedFor := func(token string) func(string) bool {
		sig := filesig.Signature("/f", filesig.Read, "", token, nil)
		q := filesig.Query{Path: "/f", Signature: sig}
		return func(tok string) bool { return q.Signed(filesig.Read, tok) }
	}
	// A genuine URL is found (the first call also loads the index).
	if id, err := d.SignedBy(signedFor("envd-sbx0500")); err != nil || id != "sbx0500" {
		t.Fatalf("a genuine signature: %q %v", id, err)
	}
	warmReads, warmRows := cs.take()
	for i := range guesses {
		if id, err := d.SignedBy(signedFor(fmt.Sprint("guess", i))); err == nil {
			t.Fatalf("guess %d found %s", i, id)
		}
	}
	reads, rows := cs.take()
	t.Logf("%d sandboxes: the first signed URL read %d times (%d rows); %d guesses then read %d times, %d rows: %.2f reads and %.2f rows a guess",
		sandboxes, warmReads, warmRows, guesses, reads, rows, float64(reads)/guesses, float64(rows)/guesses)
	if reads > guesses || rows != 0 {
		t.Errorf("%d guesses read the store %d times, %d rows: want at most one read each, of no rows while nothing changes", guesses, reads, rows)
	}
	// A sandbox made, killed or paused since is seen at once.
	rec := store.Sandbox{ID: "fresh", TeamID: "t2", TemplateID: "base", State: store.StateRunning, Node: "nb",
		StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour), EnvdAccessToken: "envd-fresh"}
	if err := c.st.CreateSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if id, err := d.SignedBy(signedFor("envd-fresh")); err != nil || id != "fresh" {
		t.Errorf("a sandbox created since: %q %v", id, err)
	}
	for _, c2 := range []struct {
		id     string
		update func(*store.Sandbox)
	}{
		{"sbx0001", func(s *store.Sandbox) { s.State = store.StateKilled }},
		{"sbx0002", func(s *store.Sandbox) { s.State = store.StatePaused }},
		{"sbx0003", func(s *store.Sandbox) { s.State = store.StatePaused; s.AutoResume = true }},
	} {
		if _, err := c.st.UpdateSandbox(ctx, c2.id, func(s *store.Sandbox) error { c2.update(s); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[string]bool{"sbx0001": false, "sbx0002": false, "sbx0003": true} {
		got, err := d.SignedBy(signedFor("envd-" + id))
		if (err == nil && got == id) != want {
			t.Errorf("%s: %q %v, want found %v", id, got, err, want)
		}
	}
	// A record deleted without a state change (a sandbox that did not
	// survive a restart) is not found either.
	if err := c.st.DeleteSandbox(ctx, "sbx0004"); err != nil {
		t.Fatal(err)
	}
	if id, err := d.SignedBy(signedFor("envd-sbx0004")); err == nil {
		t.Errorf("a deleted sandbox: %q", id)
	}
}
