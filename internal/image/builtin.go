package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/warren-sandbox/warren/internal/lockfile"
	"github.com/warren-sandbox/warren/internal/mountinfo"
)

// StepFunc prints one progress line: a phase and the time since the start.
type StepFunc func(format string, args ...any)

// BuildFunc fills dir, an empty directory, with a layer's file tree.
type BuildFunc func(ctx context.Context, dir string, step StepFunc, progress io.Writer) error

// EnsureTemplate makes sure built-in template want.ID exists, made by
// recipe want.Recipe, with one layer that build makes on top of
// want.Layers (its parents, bottom first; usually none), unless a complete
// one of that recipe exists, which makes a second call return at once.
// The layer's ID is derived from the template ID and the recipe, so a new
// recipe gets a new layer and never disturbs sandboxes running on the old
// one. It is safe to call from several processes at a time: one builds
// (in layers/.build-<ID>, under the template's lock file), the others wait
// for it. Progress lines (phase and elapsed time) go to progress, which
// may be nil.
func (s *Store) EnsureTemplate(ctx context.Context, want Template, build BuildFunc, progress io.Writer) (*Template, error) {
	if progress == nil {
		progress = io.Discard
	}
	if t := s.current(want); t != nil {
		return t, nil
	}
	unlock, err := lockfile.Acquire(ctx, s.buildLock(want.ID))
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Another process may have built it while we waited for the lock.
	if t := s.current(want); t != nil {
		return t, nil
	}

	layerID := want.ID + "-" + want.Recipe
	t := want
	t.Layers = append(append([]string(nil), want.Layers...), layerID)
	final := s.LayerDir(layerID)
	// The rename below is what completes a layer, so an existing one is
	// whole; only the template is missing (a crash came between the two).
	if _, err := os.Stat(final); err == nil {
		return &t, s.PutTemplate(&t)
	}
	tmp := filepath.Join(s.dir, "layers", ".build-"+want.ID)
	if err := mountinfo.RemoveTree(tmp); err != nil {
		return nil, fmt.Errorf("image: removing an interrupted build: %w", err)
	}
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return nil, err
	}
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(progress, "[%s %6.1fs] %s\n", want.ID, time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	step("building layer %s", layerID)
	if err := build(ctx, tmp, step, progress); err != nil {
		_ = mountinfo.RemoveTree(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = mountinfo.RemoveTree(tmp)
		return nil, err
	}
	if err := s.PutTemplate(&t); err != nil {
		return nil, err
	}
	step("template %s ready", want.ID)
	return &t, nil
}

// current returns the stored template if it was made by want's recipe and
// its layers exist.
func (s *Store) current(want Template) *Template {
	t, err := s.Template(want.ID)
	if err != nil || t.Recipe != want.Recipe || !slices.Equal(BuiltLayers(t)[:max(0, len(BuiltLayers(t))-1)], want.Layers) {
		return nil
	}
	if _, err := s.LayerDirs(t); err != nil {
		return nil
	}
	return t
}

// buildLock is the lock file that serialises builds of template id.
func (s *Store) buildLock(id string) string { return filepath.Join(s.dir, "."+id+".lock") }

// BuiltLayers are a built-in template's layers without its start
// snapshot's (SetBuiltinSnapshot), which sits on top.
func BuiltLayers(t *Template) []string {
	if n := len(t.Layers); t.Snapshot != "" && n > 0 && t.Layers[n-1] == t.Snapshot {
		return t.Layers[:n-1]
	}
	return t.Layers
}

// ErrTemplateChanged is SetBuiltinSnapshot's error when the template is
// no longer the one the snapshot was taken of.
var ErrTemplateChanged = errors.New("image: the built-in template changed while its snapshot was taken")

// SetBuiltinSnapshot records snapshot snapID (whose checkpoint image and
// layer exist), with the token of the envd inside, on built-in template
// id, if the template's layers (without a snapshot's) are still layers:
// those the snapshot was taken over. Under the template's build lock, so
// that a concurrent EnsureTemplate (another process's `warren setup`) is
// never overwritten with an older template; written atomically.
func (s *Store) SetBuiltinSnapshot(ctx context.Context, id string, layers []string, snapID, token string) error {
	if !s.HasLayer(snapID) || !s.HasSnapshot(snapID) {
		return fmt.Errorf("image: snapshot %s is not whole", snapID)
	}
	unlock, err := lockfile.Acquire(ctx, s.buildLock(id))
	if err != nil {
		return err
	}
	defer unlock()
	t, err := s.Template(id)
	if err != nil {
		return err
	}
	if !slices.Equal(BuiltLayers(t), layers) {
		return ErrTemplateChanged
	}
	t.Layers = append(slices.Clone(layers), snapID)
	t.Snapshot, t.SnapshotToken = snapID, token
	return s.PutTemplate(t)
}
