// Package image keeps templates' file systems on disk and mounts a root
// filesystem for each sandbox.
//
// On-disk layout, under the data directory (default /var/lib/warren):
//
//	layers/<layerID>/        a read-only directory tree: one layer
//	templates/<id>.json      a template: its layers (bottom first) and the
//	                         defaults of its sandboxes (user, workdir, envs,
//	                         start and ready commands)
//	sandboxes/<sandboxID>/   one sandbox's root filesystem while it exists:
//	  disk.img               sparse ext4 image of diskSizeMB, loop-mounted
//	  disk/upper, disk/work  the overlay's writable layer, on that image
//	  rootfs/                the overlay mount: layers + writable layer
//
// A layer is written once, under a temporary name, and renamed into place
// when complete, so a half-written layer is never mistaken for a finished
// one. Layers are shared by every sandbox and template that uses them.
//
// diskSizeMB is enforced by giving each sandbox's writable layer its own
// file system: a sparse file of that size, formatted ext4 and attached to
// a loop device. Writes past the size fail with ENOSPC inside the sandbox
// and cannot fill the host's disk. Space is only taken for what is written;
// formatting and mounting cost a few milliseconds (see BenchmarkMount).
package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// Template is a template's layers and sandbox defaults.
type Template struct {
	ID string `json:"id"`
	// Layers are layer IDs, bottom first.
	Layers   []string          `json:"layers"`
	User     string            `json:"user,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	Envs     map[string]string `json:"envs,omitempty"`
	StartCmd string            `json:"startCmd,omitempty"`
	ReadyCmd string            `json:"readyCmd,omitempty"`
	// Recipe identifies how a built-in template was made; a changed recipe
	// makes setup rebuild it.
	Recipe string `json:"recipe,omitempty"`
}

// Store is the data directory's templates and layers.
type Store struct {
	dir string
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Open returns the store in dataDir, creating its directories.
func Open(dataDir string) (*Store, error) {
	if !filepath.IsAbs(dataDir) {
		return nil, fmt.Errorf("image: data dir %q is not absolute", dataDir)
	}
	for _, d := range []string{"layers", "templates", "sandboxes"} {
		if err := os.MkdirAll(filepath.Join(dataDir, d), 0o755); err != nil {
			return nil, err
		}
	}
	return &Store{dir: dataDir}, nil
}

// Dir is the data directory.
func (s *Store) Dir() string { return s.dir }

// LayerDir is where layer id lives.
func (s *Store) LayerDir(id string) string { return filepath.Join(s.dir, "layers", id) }

// LayerDirs maps a template's layer IDs to their directories, bottom first.
func (s *Store) LayerDirs(t *Template) ([]string, error) {
	out := make([]string, 0, len(t.Layers))
	for _, id := range t.Layers {
		d := s.LayerDir(id)
		if _, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("image: template %s: layer %s: %w", t.ID, id, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// ErrNotFound is wrapped by errors about an unknown template.
var ErrNotFound = errors.New("not found")

// Template reads a template.
func (s *Store) Template(id string) (*Template, error) {
	if !idPattern.MatchString(id) {
		return nil, fmt.Errorf("image: invalid template id %q", id)
	}
	b, err := os.ReadFile(filepath.Join(s.dir, "templates", id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("image: template %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("image: template %s: %w", id, err)
	}
	return &t, nil
}

// PutTemplate writes a template atomically.
func (s *Store) PutTemplate(t *Template) error {
	if !idPattern.MatchString(t.ID) {
		return fmt.Errorf("image: invalid template id %q", t.ID)
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(s.dir, "templates", t.ID+".json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
