package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/store"
)

// Blobs no record names go once past the grace period; named ones and
// young ones stay.
func TestCollectBlobs(t *testing.T) {
	ctx := context.Background()
	st, blobs, dir := newBlobTest(t, "t1", "t2")
	put := func(team, content string, age time.Duration) blobstore.Digest {
		d := blobstore.DigestOf([]byte(content))
		if err := blobs.Put(ctx, team, d, int64(len(content)), bytes.NewReader([]byte(content))); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-age)
		os.Chtimes(filepath.Join(dir, "teams", team, "sha256", d.Hex()), old, old)
		return d
	}
	named := put("t1", "named", 2*time.Hour)
	orphan := put("t1", "orphan", 2*time.Hour)
	young := put("t1", "young", time.Minute)
	// The same digest named by t1's record is an orphan in t2.
	otherTeams := put("t2", "named", 2*time.Hour)
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "sb1", TeamID: "t1", TemplateID: "base", State: store.StatePaused, PausedBlob: named.String()}); err != nil {
		t.Fatal(err)
	}
	n, err := CollectBlobs(ctx, st, blobs, time.Now().Add(-DefaultBlobGCGrace))
	if err != nil || n != 2 {
		t.Fatalf("collected %d: %v", n, err)
	}
	for d, want := range map[blobstore.Digest]bool{named: true, orphan: false, young: true} {
		_, err := blobs.Stat(ctx, "t1", d)
		if got := err == nil; got != want {
			t.Errorf("t1's %s kept %v, want %v (%v)", d, got, want, err)
		}
	}
	if _, err := blobs.Stat(ctx, "t2", otherTeams); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("t2's orphan kept: %v", err)
	}
}

// A lost node's sandbox paused in the blob store is removed (record and
// blob) by another node: for its team only, not when it names this node
// or no blob; the reaper takes those paused past the retention whose
// node is lost, not a live node's nor a recent one.
func TestRemoveLostNodesPaused(t *testing.T) {
	ctx := context.Background()
	st, blobs, _ := newBlobTest(t, "t1")
	now := time.Now()
	for name, beat := range map[string]time.Time{"lost": now.Add(-time.Minute), "alive": now, "self": now} {
		if err := st.RegisterNode(ctx, store.Node{Name: name, RegisteredAt: beat, HeartbeatAt: beat}); err != nil {
			t.Fatal(err)
		}
	}
	paused := func(id, node string, pausedAt time.Time, withBlob bool) blobstore.Digest {
		d := blobstore.DigestOf([]byte(id))
		if err := blobs.Put(ctx, "t1", d, int64(len(id)), bytes.NewReader([]byte(id))); err != nil {
			t.Fatal(err)
		}
		rec := store.Sandbox{ID: id, TeamID: "t1", TemplateID: "base", State: store.StatePaused, Node: node, PausedAt: pausedAt, StartedAt: pausedAt}
		if withBlob {
			rec.PausedBlob = d.String()
		}
		if err := st.CreateSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
		return d
	}
	kept := func(id string, d blobstore.Digest, want bool) {
		t.Helper()
		_, rerr := st.GetSandbox(ctx, id)
		_, berr := blobs.Stat(ctx, "t1", d)
		if (rerr == nil) != want || (berr == nil) != want {
			t.Errorf("%s: record %v, blob %v; want kept %v", id, rerr, berr, want)
		}
	}

	d := paused("killme", "lost", now, true)
	for _, team := range []string{"", "t2"} {
		if err := RemoveFromBlobStore(ctx, st, blobs, "self", team, "killme"); !errors.Is(err, ErrNotFound) {
			t.Errorf("team %q removed it: %v", team, err)
		}
	}
	if err := RemoveFromBlobStore(ctx, st, blobs, "lost", "t1", "killme"); !errors.Is(err, ErrNotFound) {
		t.Errorf("its own node removed it as another's: %v", err)
	}
	kept("killme", d, true)
	if err := RemoveFromBlobStore(ctx, st, blobs, "self", "t1", "killme"); err != nil {
		t.Fatal(err)
	}
	kept("killme", d, false)
	if err := RemoveFromBlobStore(ctx, st, blobs, "self", "t1", "killme"); !errors.Is(err, ErrNotFound) {
		t.Errorf("removed twice: %v", err)
	}
	noBlob := paused("noblob", "lost", now, false)
	if err := RemoveFromBlobStore(ctx, st, blobs, "self", "t1", "noblob"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a sandbox paused on its node only was removed: %v", err)
	}
	kept("noblob", noBlob, true)

	old := now.Add(-2 * time.Hour)
	cutoff := now.Add(-time.Hour)
	reaped := paused("old-lost", "lost", old, true)
	gone := paused("old-unregistered", "gone", old, true)
	young := paused("young-lost", "lost", now, true)
	live := paused("old-alive", "alive", old, true)
	mine := paused("old-self", "self", old, true)
	n, err := ReapLostPaused(ctx, st, blobs, "self", cutoff, now, 10*time.Second)
	if err != nil || n != 2 {
		t.Fatalf("reaped %d: %v", n, err)
	}
	kept("old-lost", reaped, false)
	kept("old-unregistered", gone, false)
	kept("young-lost", young, true)
	kept("old-alive", live, true)
	kept("old-self", mine, true)
}

// newBlobTest opens a store and a local blob store in temp dirs, with
// teams made, for the blob collector's and remover's tests; it returns
// the blob store's directory too.
func newBlobTest(t *testing.T, teams ...string) (store.Store, *blobstore.Local, string) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	dir := t.TempDir()
	blobs, err := blobstore.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, team := range teams {
		if err := st.CreateTeam(ctx, store.Team{ID: team, Name: team, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	return st, blobs, dir
}
