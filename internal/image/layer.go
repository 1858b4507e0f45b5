package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/warren-sandbox/warren/internal/mountinfo"
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
	return mountinfo.RemoveTree(s.SnapshotDir(id))
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
