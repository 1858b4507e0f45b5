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

// A built-in template's build keeps scratch dirs beside its layer
// (.build-<ID>.work and .build-<ID>.root, where its overlay is mounted:
// internal/baseimage): they are the build's, under its lock, not
// builds of templates "<ID>.work" and "<ID>.root". Left alone while the
// build runs; once it is gone, unmounted and removed.
func TestCleanupBuildScratchDirs(t *testing.T) {
	s, _ := tinyStore(t)
	layers := filepath.Join(s.Dir(), "layers")
	build := filepath.Join(layers, ".build-busy")
	dirs := []string{build, build + ".work", build + ".root"}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("tmpfs", build+".root", "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(build+".root", unix.MNT_DETACH) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock, err := lockfile.Acquire(ctx, s.buildLock("busy"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("a running build's %s was removed: %v", filepath.Base(d), err)
		}
	}
	if !isMountPoint(t, build+".root") {
		t.Fatalf("a running build's overlay was unmounted")
	}
	unlock()
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("an interrupted build's %s is left: %v", filepath.Base(d), err)
		}
	}
	locks, _ := filepath.Glob(filepath.Join(s.Dir(), ".busy.*.lock"))
	if len(locks) > 0 {
		t.Errorf("lock files of made-up templates: %v", locks)
	}
}

func isMountPoint(t *testing.T, dir string) bool {
	t.Helper()
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		t.Fatal(err)
	}
	return st.Dev != parent.Dev
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
