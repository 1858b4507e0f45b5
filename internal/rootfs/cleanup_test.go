package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCleanup simulates what a crashed run leaves: mounted root
// filesystems (with and without a disk), a loop device attached to a
// sandbox's image with nothing mounted and a half-formatted disk image.
// (An interrupted layer build is the image store's: its TestCleanup.)
func TestCleanup(t *testing.T) {
	s, layer := tinyStore(t)
	ctx := context.Background()
	keep, err := s.Mount(ctx, "keep", []string{layer}, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Unmount()
	for _, c := range []struct {
		id string
		mb int
	}{{"left-disk", 16}, {"left-plain", 0}} {
		if _, err := s.Mount(ctx, c.id, []string{layer}, c.mb); err != nil {
			t.Fatal(err)
		}
	}
	// A loop device without autoclear, as a crash between attach and mount
	// by another tool (or a losetup by hand) would leave.
	dir := s.sandboxDir("left-loop")
	os.Mkdir(dir, 0o700)
	img, err := os.Create(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	img.Truncate(16 << 20)
	dev, err := attachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	info.Flags &^= unix.LO_FLAGS_AUTOCLEAR
	if err := unix.IoctlLoopSetStatus64(int(dev.Fd()), info); err != nil {
		t.Fatal(err)
	}
	dev.Close()
	img.Close()
	if len(loopsUnder(dir)) != 1 {
		t.Fatalf("simulated leftover loop device missing: %v", loopDevices())
	}

	tmpDisk := filepath.Join(s.Dir(), "disks", ".tmp-123.img")
	os.WriteFile(tmpDisk, nil, 0o600)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(tmpDisk, old, old)
	oldFormat := filepath.Join(s.Dir(), "disks", "ext4-16M-v0.img")
	os.WriteFile(oldFormat, nil, 0o600)
	current, err := s.diskTemplate(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}

	if err := s.Manager.Cleanup(func(id string) bool { return id == "keep" }); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"left-disk", "left-plain", "left-loop"} {
		assertGone(t, s, id)
	}
	if _, err := os.Stat(current); err != nil {
		t.Errorf("current disk image removed: %v", err)
	}
	for _, p := range []string{tmpDisk, oldFormat} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left", p)
		}
	}
	if _, err := os.Stat(filepath.Join(keep.Dir(), "etc", "from-layer")); err != nil {
		t.Errorf("Cleanup touched a known sandbox: %v", err)
	}
	if len(loopsUnder(s.sandboxDir("keep"))) != 1 {
		t.Error("Cleanup detached a known sandbox's loop device")
	}
	if err := keep.Unmount(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "keep")
}
