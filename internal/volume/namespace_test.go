package volume

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// A volume's file system unmounted here may live on in another process's
// mount namespace, what was written last maybe still only in its memory.
// Mounting the image again meanwhile through a second loop device showed
// a stale disk (TestQuotaVolume, beside other tests' runtimes: "after a
// remount: no such file") and two ext4 instances writing one image. The
// mount waits for the old one to go, and fails cleanly if it does not.
func TestQuotaVolumeRemountWaitsForAHolder(t *testing.T) {
	ctx := context.Background()
	m, v, dir, fs, _ := newQuotaVolume(t, "held")
	if err := os.WriteFile(filepath.Join(dir, "written"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The holder goes 300 ms after the unmount: the mount waits for it.
	release := testenv.HoldMounts(t, fs)
	if err := unix.Unmount(fs, 0); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(300 * time.Millisecond); release() }()
	if _, err := m.HostDir(ctx, v.ID); err != nil {
		t.Fatalf("mounting while another namespace held the volume for 300 ms: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "written")); err != nil || string(b) != "before" {
		t.Errorf("after the remount: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "written"), []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The holder stays: the mount fails and mounts nothing, then works
	// once it is gone.
	release = testenv.HoldMounts(t, fs)
	if err := unix.Unmount(fs, 0); err != nil {
		t.Fatal(err)
	}
	old := diskReleaseWait
	diskReleaseWait = 500 * time.Millisecond
	defer func() { diskReleaseWait = old }()
	if _, err := m.HostDir(ctx, v.ID); err == nil || !strings.Contains(err.Error(), "still mounted") {
		t.Errorf("mounting while the volume stays held elsewhere: %v, want a \"still mounted\" error", err)
	}
	if below, _ := mountinfo.Below(fs); len(below) != 0 {
		t.Errorf("mounts left by the failed mount: %v", below)
	}
	release()
	if _, err := m.HostDir(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "written")); err != nil || string(b) != "after" {
		t.Errorf("after the second remount: %q %v", b, err)
	}
}
