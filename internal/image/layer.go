package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// HasLayer tells whether layer id exists (and so is complete: layers are
// renamed into place whole).
func (s *Store) HasLayer(id string) bool {
	if !idPattern.MatchString(id) {
		return false
	}
	fi, err := os.Stat(s.LayerDir(id))
	return err == nil && fi.IsDir()
}

// Commit turns what the sandbox wrote into layer layerID and removes the
// root filesystem, which must have been mounted without a disk limit
// (diskSizeMB 0: its writable layer is a plain directory of the data
// directory, so committing it is a rename). The container must be gone.
//
// The writable layer is an overlayfs upper dir: deleted files are
// whiteouts and replaced directories are marked opaque, which overlayfs
// honours in lower layers too, so it serves as a layer unchanged. If
// layerID already exists (another build made the same step meanwhile),
// that one is kept and this one dropped. On failure the root filesystem
// is still removed and no layer is made.
func (r *Rootfs) Commit(s *Store, layerID string) error {
	if !idPattern.MatchString(layerID) {
		_ = r.Unmount()
		return fmt.Errorf("image: invalid layer id %q", layerID)
	}
	if r.upper != filepath.Join(r.dir, "upper") {
		_ = r.Unmount()
		return errors.New("image: only a root filesystem without a disk limit can be committed")
	}
	if err := unmount(r.merged); err != nil {
		_ = r.Unmount()
		return err
	}
	final := s.LayerDir(layerID)
	err := os.Rename(r.upper, final)
	if errors.Is(err, os.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
		err = nil // the same step, made by another build: keep that one
	}
	if uerr := r.Unmount(); err == nil {
		err = uerr
	}
	return err
}

// SnapshotDir is where checkpoint image id lives: a template's sandbox
// with its start command running.
func (s *Store) SnapshotDir(id string) string {
	return filepath.Join(s.dir, "snapshots", id)
}

// HasSnapshot tells whether checkpoint image id exists.
func (s *Store) HasSnapshot(id string) bool {
	if !idPattern.MatchString(id) {
		return false
	}
	_, err := os.Stat(s.SnapshotDir(id))
	return err == nil
}

// RemoveSnapshot deletes checkpoint image id.
func (s *Store) RemoveSnapshot(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("image: invalid snapshot id %q", id)
	}
	return removeTree(s.SnapshotDir(id))
}

// RemoveTemplate deletes template id's record (not its layers, which
// other templates and the build cache may share).
func (s *Store) RemoveTemplate(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("image: invalid template id %q", id)
	}
	err := os.Remove(filepath.Join(s.dir, "templates", id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
