package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// holdMounts holds dir's disk mounted in a mount namespace of its own, as
// a runtime process of any server on the host (runsc's sandbox and gofer
// unshare their mount namespace before they pivot into their own root)
// holds it for a moment (testenv.HoldMounts).
func holdMounts(t *testing.T, dir string) (release func()) {
	return testenv.HoldMounts(t, dir+"/disk")
}

// A paused sandbox's disk may still be mounted in another process's mount
// namespace when it is resumed (another server's runsc starting up copied
// the host's mounts a moment before the pause unmounted them). Its
// file system then lives on there, with what the sandbox wrote maybe
// still only in memory: mounting the image a second time through a new
// loop device would show a stale disk (the overlay's upper dir missing:
// "mounting the overlay: no such file or directory", issue 28) and two
// ext4 instances writing one image. Remount waits for the old one to go,
// and fails cleanly, files kept, if it does not go in time.
func TestRemountWaitsForADiskHeldElsewhere(t *testing.T) {
	s, layer := tinyStore(t)
	ctx := context.Background()
	r, err := s.Mount(ctx, "held", []string{layer}, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove("held")
	if err := os.WriteFile(filepath.Join(r.Dir(), "written"), []byte("before the pause"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The holder goes soon after the pause (runsc pivots into its own
	// root within milliseconds): the resume waits for it, and finds
	// everything.
	release := holdMounts(t, r.Home())
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(300 * time.Millisecond); release() }()
	r2, err := s.Remount(ctx, "held", []string{layer})
	if err != nil {
		t.Fatalf("Remount while another namespace held the disk for 300ms: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(r2.Dir(), "written")); err != nil || string(b) != "before the pause" {
		t.Errorf("after Remount: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(r2.Dir(), "written"), []byte("after the resume"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The holder stays: the resume fails without mounting anything, and
	// works once it is gone.
	release = holdMounts(t, r2.Home())
	if err := r2.Detach(); err != nil {
		t.Fatal(err)
	}
	s.Manager.diskReleaseWait = 500 * time.Millisecond
	if _, err := s.Remount(ctx, "held", []string{layer}); err == nil || !strings.Contains(err.Error(), "still mounted") {
		t.Errorf("Remount while the disk stays held elsewhere: %v, want a \"still mounted\" error", err)
	}
	if m := mountsUnder(t, r2.Home()); len(m) > 0 {
		t.Errorf("mounts left by the failed Remount: %v", m)
	}
	release()
	r3, err := s.Remount(ctx, "held", []string{layer})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(r3.Dir(), "written")); err != nil || string(b) != "after the resume" {
		t.Errorf("after the second Remount: %q %v", b, err)
	}
}
