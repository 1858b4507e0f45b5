package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// fakeSnapshotter "snapshots" the sandboxes of its map (sandbox ID →
// team): it writes a checkpoint file and a disk image into the dir, as
// the sandbox manager would.
type fakeSnapshotter struct {
	teams map[string]string
	calls int
}

func (f *fakeSnapshotter) Snapshot(_ context.Context, teamID team.ID, id, dir string) (sandbox.Snapshot, error) {
	f.calls++
	if f.teams[id] != teamID.String() {
		return sandbox.Snapshot{}, fmt.Errorf("%w: %s", sandbox.ErrNotFound, id)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return sandbox.Snapshot{}, err
	}
	os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("state"), 0o600)
	os.WriteFile(filepath.Join(dir, "disk.img"), []byte("disk"), 0o600)
	return sandbox.Snapshot{
		Sandbox: store.Sandbox{ID: id, TeamID: teamID.String(), CPUCount: 1, MemoryMB: 300, DiskSizeMB: 64, EnvdVersion: "0.6", EnvdAccessToken: "tok-" + id},
		Image:   image.Template{Layers: []string{"base-layer"}, User: "user", Workdir: "/home/user", SnapshotToken: "tok-" + id, SnapshotDisk: true},
	}, nil
}

// A snapshot is a template of the team, resolvable by ID and name (with or
// without its tag and a namespace), listed, re-snapshotted under a name,
// and deleted with its files; names and teams are checked first.
func TestSnapshotsAreTemplatesOfTheTeam(t *testing.T) {
	st := newStore(t)
	addTeam(t, st, "t2")
	dir := t.TempDir()
	b := newUploadBuilder(t, st, dir)
	fs := &fakeSnapshotter{teams: map[string]string{"sbA": "t1", "sbB": "t1", "sbX": "t2"}}
	b.UseSandboxes(fs)
	ctx := context.Background()

	anon, err := b.CreateSnapshot(ctx, "t1", "", "sbA", "")
	if err != nil {
		t.Fatal(err)
	}
	if anon.SnapshotID != anon.Template.ID+":default" || len(anon.Names) != 0 || anon.Template.SnapshotOf != "sbA" {
		t.Errorf("unnamed snapshot: %+v", anon)
	}
	// Lists are newest first by creation time, kept in milliseconds: the
	// next one must not share this one's.
	time.Sleep(5 * time.Millisecond)
	named, err := b.CreateSnapshot(ctx, "t1", "", "sbB", "team/mine:v1")
	if err != nil {
		t.Fatal(err)
	}
	if named.SnapshotID != "mine:v1" || fmt.Sprint(named.Names) != "[mine]" {
		t.Errorf("named snapshot: %+v", named)
	}
	for _, ref := range []string{anon.SnapshotID, anon.Template.ID, "mine:v1", "other-ns/mine:v1", "mine", named.Template.ID + ":v1"} {
		r, err := b.Resolve(ctx, "t1", ref)
		if err != nil {
			t.Errorf("resolving %q: %v", ref, err)
			continue
		}
		if !r.Image.SnapshotDisk || r.Image.Snapshot == "" || r.MemoryMB != 300 || r.CPUCount != 1 {
			t.Errorf("%q resolves to %+v", ref, r.Image)
		}
		if _, err := os.Stat(filepath.Join(b.cfg.Images.SnapshotDir(r.Image.Snapshot), "checkpoint.img")); err != nil {
			t.Errorf("%q: its snapshot's files: %v", ref, err)
		}
	}
	if _, err := b.Resolve(ctx, "t2", "mine:v1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team resolves the snapshot: %v", err)
	}

	// The same name again: a new snapshot under it (another tag).
	again, err := b.CreateSnapshot(ctx, "t1", "", "sbA", "mine:v2")
	if err != nil || again.Template.ID != named.Template.ID || again.Template.SnapshotOf != "sbA" {
		t.Fatalf("second snapshot under the name: %+v %v", again, err)
	}
	r1, _ := b.Resolve(ctx, "t1", "mine:v1")
	r2, _ := b.Resolve(ctx, "t1", "mine:v2")
	if r1.BuildID == r2.BuildID {
		t.Error("the two snapshots under one name share a build")
	}

	// Refused names, before anything is snapshotted.
	if _, err := b.Create(ctx, CreateRequest{TeamID: "t1", Name: "built"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSnapshot(ctx, "t2", "", "sbX", "theirs"); err != nil {
		t.Fatal(err)
	}
	before := fs.calls
	for name, want := range map[string]error{
		"built":                          ErrConflict, // the team's built template
		"base":                           ErrConflict,
		"Bad Name":                       ErrInvalid,
		"etc/..:x":                       ErrInvalid,
		"../.hidden":                     ErrInvalid,
		"../../etc":                      ErrInvalid,
		"a/b/c":                          ErrInvalid,
		"ok:bad tag":                     ErrInvalid,
		"ok:":                            ErrInvalid,
		"a:" + string(make([]byte, 300)): ErrInvalid,
	} {
		if _, err := b.CreateSnapshot(ctx, "t1", "", "sbA", name); !errors.Is(err, want) {
			t.Errorf("name %q: %v, want %v", name, err, want)
		}
	}
	if fs.calls != before {
		t.Errorf("refused names reached the sandbox manager %d times", fs.calls-before)
	}
	if _, err := b.CreateSnapshot(ctx, "t1", "", "sbX", ""); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a snapshot of another team's sandbox: %v", err)
	}
	if _, err := b.CreateSnapshot(ctx, "", "", "sbA", ""); err == nil {
		t.Error("a snapshot without a team was taken")
	}

	// Listing: the team's, newest first, by sandbox or name.
	list := func(sandboxID, name string) string {
		t.Helper()
		refs, err := b.ListSnapshots(ctx, "t1", sandboxID, name, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range refs {
			out = append(out, r.SnapshotID)
		}
		return fmt.Sprint(out)
	}
	if got := list("", ""); got != fmt.Sprintf("[mine:v2 %s]", anon.SnapshotID) {
		t.Errorf("the team's snapshots: %s", got)
	}
	if got := list("sbB", ""); got != "[]" {
		t.Errorf("snapshots of sbB (now taken over by sbA's): %s", got)
	}
	if got := list("", "team/mine"); got != "[mine:v2]" {
		t.Errorf("by name: %s", got)
	}
	if got := list("sbX", ""); got != "[]" {
		t.Errorf("another team's sandbox: %s", got)
	}

	// Delete (DELETE /templates/{snapshotID}): records and files go, a
	// second delete is not found.
	snapDirs, _ := filepath.Glob(filepath.Join(dir, "snapshots", snapshotDirPrefix+"*"))
	if len(snapDirs) != 4 {
		t.Fatalf("snapshot dirs: %v", snapDirs)
	}
	if err := b.Delete(ctx, "t1", "mine:v1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, "t1", "mine:v1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if err := b.Delete(ctx, "t2", anon.SnapshotID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team deletes the snapshot: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "snapshots", snapshotDirPrefix+"*"))
	if len(left) != 2 {
		t.Errorf("after deleting the named template's two snapshots: %v", left)
	}

	// Names are per team: t2's "theirs" does not keep t1 from one.
	ours, err := b.CreateSnapshot(ctx, "t1", "", "sbA", "theirs")
	if err != nil {
		t.Fatalf("a name another team has: %v", err)
	}
	if r, err := b.Resolve(ctx, "t2", "theirs"); err != nil || r.TemplateID == ours.Template.ID {
		t.Errorf("t2's theirs resolves to %q %v, not its own", r.TemplateID, err)
	}
}

// A snapshot directory no build records (warren stopped between the
// checkpoint and the records) is removed at the next start.
func TestStartRemovesUnrecordedSnapshots(t *testing.T) {
	st := newStore(t)
	dir := t.TempDir()
	b := newUploadBuilder(t, st, dir)
	b.UseSandboxes(&fakeSnapshotter{teams: map[string]string{"sbA": "t1"}})
	kept, err := b.CreateSnapshot(context.Background(), "t1", "", "sbA", "")
	if err != nil {
		t.Fatal(err)
	}
	orphan := b.cfg.Images.SnapshotDir(snapshotDirPrefix + newUUID())
	os.MkdirAll(orphan, 0o700)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(orphan, old, old)
	fresh := b.cfg.Images.SnapshotDir(snapshotDirPrefix + newUUID())
	os.MkdirAll(fresh, 0o700)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("an unrecorded snapshot is left: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a snapshot being taken now was removed: %v", err)
	}
	r, err := b.Resolve(context.Background(), "t1", kept.SnapshotID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.cfg.Images.SnapshotDir(r.Image.Snapshot)); err != nil {
		t.Errorf("a recorded snapshot was removed: %v", err)
	}
}
