package image

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/lockfile"
	"golang.org/x/sys/unix"
)

// TestCleanup simulates what a crashed run leaves in layers/: an
// interrupted layer build.
func TestCleanup(t *testing.T) {
	s, _ := tinyStore(t)
	build := filepath.Join(s.Dir(), "layers", ".build-crashed")
	os.MkdirAll(filepath.Join(build, "etc"), 0o755)
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(build); err == nil {
		t.Errorf("%s left", build)
	}
}

// TestCleanupLeavesRunningBuild: a build in progress holds its lock.
func TestCleanupLeavesRunningBuild(t *testing.T) {
	s, _ := tinyStore(t)
	build := filepath.Join(s.Dir(), "layers", ".build-busy")
	os.MkdirAll(build, 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock, err := lockfile.Acquire(ctx, s.buildLock("busy"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(build); err != nil {
		t.Errorf("a running build was removed: %v", err)
	}
}

func TestOCICleanupTemps(t *testing.T) {
	s, _ := tinyStore(t)
	stale := filepath.Join(s.Dir(), "layers", OCITempPrefix+"stale")
	busy := filepath.Join(s.Dir(), "layers", OCITempPrefix+"busy")
	old := time.Now().Add(-time.Hour)
	for _, d := range []string{stale, busy} {
		if err := os.MkdirAll(filepath.Join(d, "x"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(busy, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale unpack left: %v", err)
	}
	if _, err := os.Lstat(busy); err != nil {
		t.Errorf("unpack in progress removed: %v", err)
	}
	if _, err := os.Lstat(s.LayerDir("l1")); err != nil {
		t.Errorf("a layer was removed: %v", err)
	}
}
