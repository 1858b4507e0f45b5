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
	"github.com/warren-sandbox/warren/internal/team"
)

// The blob collector keeps the blobs snapshots' records name (of their
// team only), and removes an old record whose build never came, or is
// gone, with its blob; a young one (a snapshot being recorded) stays.
func TestCollectBlobsKeepsSnapshots(t *testing.T) {
	ctx := context.Background()
	st, blobs, dir := newBlobTest(t, "t1", "t2")
	old := time.Now().Add(-2 * time.Hour)
	put := func(team, content string) blobstore.Digest {
		d := blobstore.DigestOf([]byte(content))
		if err := blobs.Put(ctx, team, d, int64(len(content)), bytes.NewReader([]byte(content))); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(filepath.Join(dir, "teams", team, "sha256", d.Hex()), old, old)
		return d
	}
	kept := put("t1", "a snapshot")
	buildGone := put("t1", "a deleted snapshot")
	recording := put("t1", "a snapshot being recorded")
	otherTeam := put("t2", "a snapshot") // t1's record names t1's blob only
	if err := st.CreateTemplate(ctx, store.Template{ID: "tpl", TeamID: "t1", SnapshotOf: "sb", CreatedAt: old}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateBuild(ctx, store.Build{ID: "b1", TemplateID: "tpl", Status: store.BuildReady, CreatedAt: old}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []store.SnapshotBlob{
		{BuildID: "b1", TeamID: "t1", Blob: kept.String(), CreatedAt: old},
		{BuildID: "gone", TeamID: "t1", Blob: buildGone.String(), CreatedAt: old},
		{BuildID: "coming", TeamID: "t1", Blob: recording.String(), CreatedAt: time.Now()},
	} {
		if err := st.PutSnapshotBlob(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	n, err := CollectBlobs(ctx, st, blobs, time.Now().Add(-DefaultBlobGCGrace))
	if err != nil || n != 2 {
		t.Fatalf("collected %d: %v", n, err)
	}
	for d, want := range map[blobstore.Digest]bool{kept: true, buildGone: false, recording: true} {
		_, err := blobs.Stat(ctx, "t1", d)
		if got := err == nil; got != want {
			t.Errorf("t1's %s kept %v, want %v (%v)", d, got, want, err)
		}
	}
	if _, err := blobs.Stat(ctx, "t2", otherTeam); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("t2's orphan kept: %v", err)
	}
	if _, err := st.GetSnapshotBlob(ctx, "t1", "gone"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the record of a gone build stays: %v", err)
	}
	for _, b := range []string{"b1", "coming"} {
		if _, err := st.GetSnapshotBlob(ctx, "t1", b); err != nil {
			t.Errorf("record %s: %v", b, err)
		}
	}
}

// With a blob store, the pause of a sandbox without a disk limit (its
// writable layer a directory, which a pack does not carry) is refused
// before anything is done, as invalid (the API's 400), and the sandbox
// runs on; nothing is put in the store.
func TestPauseWithoutDiskLimitIsRefusedWithAStore(t *testing.T) {
	blobs, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, newStore(t), Config{Blobs: blobs, BlobTemp: t.TempDir()})
	defer e.destroy()
	e.mgr.cfg.Resources.DiskSizeMB = 0 // no warm pool: nothing reads it meanwhile
	rec, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	paused, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, false)
	if !errors.Is(err, ErrInvalid) || paused {
		t.Fatalf("pause of a sandbox without a disk limit into the store: paused %v, %v", paused, err)
	}
	t.Logf("refused: %v", err)
	if got, err := e.store.GetSandbox(ctx, rec.ID); err != nil || got.State != store.StateRunning {
		t.Fatalf("after the refused pause: %s %v", got.State, err)
	}
	if out := run(t, e.mgr, rec, "echo still-running"); out != "still-running\n" {
		t.Errorf("the sandbox after the refused pause: %q", out)
	}
	if infos, err := blobs.List(ctx, "t1"); err != nil || len(infos) != 0 {
		t.Errorf("the store holds %v (%v)", infos, err)
	}
}

// A paused sandbox is forked from its pause checkpoint (no blob store
// here): the child continues its processes with its files, the parent
// stays paused and resumes; one paused without its memory has nothing to
// fork from (ErrConflict); another team finds nothing.
func TestForkOfAPausedSandbox(t *testing.T) {
	e := startRunsc(t, newStore(t), Config{})
	defer e.destroy()
	ctx := context.Background()
	t1 := team.MustParse("t1")
	parent, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	run(t, e.mgr, parent, counterLoop+"; echo paused-parent > /home/user/file")
	_, pid := count(t, e.mgr, parent)
	if _, err := e.mgr.Pause(ctx, t1, parent.ID, true); err != nil {
		t.Fatal(err)
	}
	released(t, e.mgr, parent.ID)
	if _, err := e.mgr.Fork(ctx, team.MustParse("t2"), parent.ID, time.Minute, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team's fork of the paused sandbox: %v", err)
	}
	results, err := e.mgr.Fork(ctx, t1, parent.ID, time.Minute, 1)
	if err != nil || len(results) != 1 || results[0].Err != nil {
		t.Fatalf("fork of a paused sandbox: %+v %v", results, err)
	}
	child := results[0].Sandbox
	if _, p := count(t, e.mgr, child); p != pid {
		t.Errorf("the child: pid %d, want the parent's %d", p, pid)
	}
	if out := run(t, e.mgr, child, "cat /home/user/file"); out != "paused-parent\n" {
		t.Errorf("the child sees %q", out)
	}
	if got, err := e.store.GetSandbox(ctx, parent.ID); err != nil || got.State != store.StatePaused {
		t.Errorf("the parent after the fork: %s %v", got.State, err)
	}
	if entries, _ := filepath.Glob(e.mgr.cfg.Images.SnapshotDir(forkSnapshotPrefix + "*")); len(entries) != 0 {
		t.Errorf("the fork's snapshot is left: %v", entries)
	}
	if _, _, err := e.mgr.Connect(ctx, t1, parent.ID, time.Minute, true); err != nil {
		t.Fatalf("resume of the forked parent: %v", err)
	}
	if _, p := count(t, e.mgr, parent); p != pid {
		t.Errorf("the resumed parent: pid %d, want %d", p, pid)
	}
	if _, err := e.mgr.Pause(ctx, t1, parent.ID, false); err != nil {
		t.Fatal(err)
	}
	released(t, e.mgr, parent.ID)
	if _, err := e.mgr.Fork(ctx, t1, parent.ID, time.Minute, 1); !errors.Is(err, ErrConflict) {
		t.Errorf("fork of a sandbox paused without its memory: %v", err)
	}
}
