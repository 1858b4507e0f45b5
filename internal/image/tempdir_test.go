package image

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A TempDir is locked while it is written, renamed by Commit, removed by
// Close otherwise; when another writer made the same dir meanwhile, that
// one stays.
func TestTempDir(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	locked := func(p string) bool {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil
	}

	tmp, err := s.LayerTemp(PullTempPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if !locked(tmp.Path) {
		t.Error("a temporary dir being written is not locked")
	}
	os.WriteFile(filepath.Join(tmp.Path, "f"), []byte("x"), 0o644)
	final := s.LayerDir("l1")
	if err := tmp.Commit(final); err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	if b, err := os.ReadFile(filepath.Join(final, "f")); err != nil || string(b) != "x" {
		t.Fatalf("committed layer: %q %v", b, err)
	}

	again, err := s.LayerTemp(PullTempPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Commit(final); err != nil {
		t.Errorf("a layer made meanwhile: %v", err)
	}
	again.Close()
	if _, err := os.Stat(filepath.Join(final, "f")); err != nil {
		t.Error("the layer made first was replaced")
	}

	dropped, err := s.SnapshotTemp(PullTempPrefix)
	if err != nil {
		t.Fatal(err)
	}
	dropped.Close()
	left, _ := filepath.Glob(filepath.Join(s.Dir(), "*", PullTempPrefix+"*"))
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
