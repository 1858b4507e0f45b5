package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
)

// A detached root filesystem keeps its files, holds no mount or loop
// device, and comes back with them (what a resumed sandbox sees) when
// remounted; a copy of its disk starts another sandbox with the same
// files, after which the two differ.
func TestDetachRemountAndCopy(t *testing.T) {
	s, layer := tinyStore(t)
	ctx := context.Background()
	r, err := s.Mount(ctx, "kept", []string{layer}, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove("kept")
	write := func(r *Root, name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(r.Dir(), name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(r *Root, name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(r.Dir(), name))
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	write(r, "written", "before the pause")
	mtime := func(r *Root) time.Time {
		fi, err := os.Stat(filepath.Join(r.Dir(), "written"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.ModTime()
	}
	before := mtime(r)
	if err := os.MkdirAll(r.CheckpointDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(r.CheckpointDir(), "checkpoint.img"), []byte("state"), 0o600)

	// The copy is taken while mounted (the sandbox frozen).
	copyImg := filepath.Join(t.TempDir(), "disk.img")
	if err := r.CopyDisk(copyImg); err != nil {
		t.Fatal(err)
	}
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(t, r.Home()); len(m) > 0 {
		t.Errorf("mounts left after Detach: %v", m)
	}
	if !poll.Within(3*time.Second, 10*time.Millisecond, func() bool { return len(loopsUnder(r.Home())) == 0 }) {
		t.Errorf("loop devices left after Detach: %v", loopsUnder(r.Home()))
	}
	if k, ok := s.Kept("kept"); !ok || k.Home() != r.Home() {
		t.Errorf("Kept = %v %v", k, ok)
	}
	if err := r.Detach(); err != nil {
		t.Errorf("a second Detach: %v", err)
	}

	r2, err := s.Remount(ctx, "kept", []string{layer})
	if err != nil {
		t.Fatal(err)
	}
	if got := read(r2, "written"); got != "before the pause" {
		t.Errorf("after Remount: %q", got)
	}
	if !mtime(r2).Equal(before) {
		t.Errorf("mtime changed over Detach/Remount: %v → %v", before, mtime(r2))
	}
	if b, err := os.ReadFile(filepath.Join(r2.CheckpointDir(), "checkpoint.img")); err != nil || string(b) != "state" {
		t.Errorf("the checkpoint beside it: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(r2.Dir(), "etc", "from-layer")); err != nil {
		t.Errorf("the layer under the remounted root: %v", err)
	}
	// Remount over a root that is still mounted (an interrupted resume)
	// takes the old mounts down first.
	r3, err := s.Remount(ctx, "kept", []string{layer})
	if err != nil {
		t.Fatal(err)
	}
	if got := read(r3, "written"); got != "before the pause" {
		t.Errorf("after a second Remount: %q", got)
	}
	if n := len(mountsUnder(t, r3.Home())); n != 2 {
		t.Errorf("%d mounts after remounting a mounted root, want 2 (disk and overlay): %v", n, mountsUnder(t, r3.Home()))
	}

	c, err := s.MountCopy(ctx, "copy", []string{layer}, copyImg)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(c, "written"); got != "before the pause" {
		t.Errorf("in the copy: %q", got)
	}
	write(c, "written", "the copy's own")
	if got := read(r3, "written"); got != "before the pause" {
		t.Errorf("the original after the copy wrote: %q", got)
	}
	if size, err := DiskSizeMB(filepath.Join(c.Home(), DiskImageName)); err != nil || size != 32 {
		t.Errorf("the copy's disk: %d MB %v", size, err)
	}
	if err := c.Unmount(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "copy")
	if err := s.Remove("kept"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "kept")
	if _, err := s.Remount(ctx, "kept", []string{layer}); err == nil {
		t.Error("Remount of a removed root succeeded")
	}
}

// Without a disk limit the writable layer is a directory: it is kept and
// remounted the same way, but there is no disk image to copy.
func TestDetachWithoutDisk(t *testing.T) {
	s, layer := tinyStore(t)
	ctx := context.Background()
	r, err := s.Mount(ctx, "plain", []string{layer}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove("plain")
	os.WriteFile(filepath.Join(r.Dir(), "f"), []byte("kept"), 0o644)
	if err := r.CopyDisk(filepath.Join(t.TempDir(), "d.img")); !errors.Is(err, ErrNoDisk) {
		t.Errorf("CopyDisk without a disk: %v", err)
	}
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	r2, err := s.Remount(ctx, "plain", []string{layer})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(r2.Dir(), "f")); string(b) != "kept" {
		t.Errorf("after Remount: %q", b)
	}
}

// A mount still in use is not detached lazily (its data would reach the
// disk image after a remount): Detach fails, and works once it is free.
func TestDetachRefusesABusyMount(t *testing.T) {
	s, layer := tinyStore(t)
	r, err := s.Mount(context.Background(), "busy", []string{layer}, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove("busy")
	f, err := os.Create(filepath.Join(r.Dir(), "open"))
	if err != nil {
		t.Fatal(err)
	}
	err = r.Detach()
	f.Close()
	if err == nil {
		t.Fatal("Detach of a mount with an open file succeeded")
	}
	if err := r.Detach(); err != nil {
		t.Errorf("Detach once the file is closed: %v", err)
	}
}
