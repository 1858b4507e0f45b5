package image

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// TempDir is a layer or checkpoint being written in a temporary dir of the
// store before it is renamed into place. It is flocked from creation to
// Close, so that Cleanup leaves it alone, and Commit syncs its file system
// before the rename: after a crash, a layer or checkpoint dir that exists
// is whole.
type TempDir struct {
	// Path is the temporary dir.
	Path string
	dir  *os.File
	done bool
}

// LayerTemp makes a locked temporary dir in layers/, named prefix (one of
// the *TempPrefix constants) and a random suffix, for a layer.
func (s *Store) LayerTemp(prefix string) (*TempDir, error) {
	return newTempDir(filepath.Join(s.dir, "layers"), prefix)
}

// SnapshotTemp is LayerTemp for a checkpoint, in snapshots/.
func (s *Store) SnapshotTemp(prefix string) (*TempDir, error) {
	return newTempDir(filepath.Join(s.dir, "snapshots"), prefix)
}

func newTempDir(parent, prefix string) (*TempDir, error) {
	p, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		return nil, err
	}
	d, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		_ = os.RemoveAll(p)
		return nil, err
	}
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		d.Close()
		_ = os.RemoveAll(p)
		return nil, fmt.Errorf("image: locking %s: %w", p, err)
	}
	return &TempDir{Path: p, dir: d}, nil
}

// Dir is the open temporary dir, for writes relative to it.
func (t *TempDir) Dir() *os.File { return t.dir }

// Commit syncs the dir's file system and renames the dir to final. If
// final was made meanwhile (by another writer of the same content), that
// one stays and this one goes at Close.
func (t *TempDir) Commit(final string) error {
	if err := unix.Syncfs(int(t.dir.Fd())); err != nil {
		return err
	}
	if err := os.Rename(t.Path, final); err != nil {
		if _, serr := os.Lstat(final); serr != nil {
			return err
		}
		return nil
	}
	t.done = true
	return nil
}

// Close removes the dir unless Commit renamed it, and unlocks it.
func (t *TempDir) Close() {
	if !t.done {
		_ = os.RemoveAll(t.Path)
	}
	t.dir.Close()
}
