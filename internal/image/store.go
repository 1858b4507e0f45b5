// Package image keeps templates' file systems on disk: read-only layers,
// the templates that list them with their sandboxes' defaults, and the
// checkpoint images of started templates. Other packages make layers and
// put them here: internal/baseimage (the Debian base, by debootstrap),
// internal/oci (registry pulls and archive imports) and internal/rootfs
// (what a build step's sandbox wrote); internal/rootfs mounts sandboxes'
// root filesystems over them.
//
// On-disk layout, under the data directory (default /var/lib/warren):
//
//	layers/<layerID>/             a read-only directory tree: one layer
//	layers/.build-<templateID>/   a layer being built; never used, removed
//	                              by the next build or by Cleanup
//	layers/oci-[<team>-]<diffID>/ an OCI image's layer, unpacked (internal/oci)
//	layers/.tmp-oci-*/            one being unpacked; removed by Cleanup
//	layers/.tmp-commit-*/         a sandbox's writes being committed as a
//	                              layer (internal/rootfs); removed by Cleanup
//	layers/step-<key>/            a template build step's layer (internal/
//	                              template): what the step wrote, committed
//	                              from its sandbox's writable layer
//	layers/snap-<key>/            the files of a build's started sandbox
//	.<templateID>.lock            flock held while that template is built
//	snapshots/<snapshotID>/       checkpoint image of a template's sandbox
//	                              with its start command running
//	snapshots/sbx-<buildID>/      a running sandbox's snapshot (internal/
//	                              template): checkpoint image and disk.img
//	snapshots/fork-<random>/      a fork's snapshot while its children
//	                              are restored (internal/sandbox)
//	uploads/<templateID>/<hash>   files uploaded for a build's COPY steps
//	                              (internal/template)
//	templates/<templateID>.json   a template: its layer IDs (bottom first),
//	                              the defaults of its sandboxes (user,
//	                              workdir, envs, start and ready commands)
//	                              and, if built in, the recipe that made it
//	disks/, sandboxes/            sandboxes' root filesystems (internal/rootfs)
//
// Lifecycle. A layer is built under layers/.build-<templateID> and renamed
// into place when complete: the rename is the commit, so an interrupted
// build never looks complete, and a layer dir that exists is whole. The
// template that names it is written (atomically) after the rename; a crash
// between the two only means the next call writes it. A built-in template
// records its recipe, and its layer ID includes it, so a changed recipe
// builds a new layer beside the old one, which sandboxes still running on
// it keep using. EnsureTemplate does this for built-in templates such as
// `base` (internal/baseimage), serialised between processes by the lock
// file. Unpacked and committed layers are written into a temporary dir of
// layers/ (LayerTemp), flock'ed while they are written, and renamed
// into place the same way. Layers are shared, read-only, by every sandbox
// and template that uses them.
//
// The data directory is root's, mode 0700 (internal/setup), and what Open
// creates is 0700: layers hold tenants' setuid programs, and no other
// local user may reach them.
//
// Tenant trees on the host. Layers are written by tenants, so every host
// access to a path inside one resolves it inside that tree or does not
// follow links at all: OCI layers are unpacked by internal/layertar,
// committed layers copied by internal/rootfs with directory descriptors;
// Cleanup and RemoveSnapshot unmount whatever is below a tree, then remove
// it with os.RemoveAll, which works with unlinkat and O_NOFOLLOW relative
// to directory descriptors: never through a tenant's link. Uploads for
// COPY steps are plain files under uploads/, named by validated IDs, and
// are unpacked by envd inside the build sandbox, never on the host.
// Checkpoint images (snapshots/) are written by runsc. The base layer is
// debootstrap's, not a tenant's.
package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// VolumeMount is a team volume (by ID, with its name when it was mounted)
// mounted at Path.
type VolumeMount struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Path     string `json:"path"`
}

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
	// Snapshot, if set, names the checkpoint image (SnapshotDir) of a
	// sandbox of these layers with StartCmd already running: sandboxes of
	// the template are restored from it instead of booted.
	Snapshot string `json:"snapshot,omitempty"`
	// SnapshotToken is the access token of the envd inside Snapshot (the
	// build sandbox's, checkpointed with it): a restored sandbox's /init
	// must present it. It is a secret: template files are 0600 in the
	// 0700 data dir.
	SnapshotToken string `json:"snapshotToken,omitempty"`
	// PulledFrom names the node this image was pulled from (a cluster's
	// template built elsewhere, internal/imagepeer); "" for one made here.
	PulledFrom string `json:"pulledFrom,omitempty"`
	// SnapshotDisk says that Snapshot's directory also holds a copy of
	// the checkpointed sandbox's writable layer (node.SnapshotDiskName),
	// which each restored sandbox starts from: a running sandbox's
	// snapshot, whose files are not in a layer. A build's snapshot has
	// its files in its top layer instead.
	SnapshotDisk bool `json:"snapshotDisk,omitempty"`
	// SnapshotMounts are the team volumes the checkpointed sandbox had
	// mounted: a snapshot refers to them (it holds none of their files),
	// and each sandbox restored from it mounts the same volumes at the same
	// paths, as its checkpoint expects.
	SnapshotMounts []VolumeMount `json:"snapshotMounts,omitempty"`
	// Recipe identifies how a built-in template was made; a changed recipe
	// makes setup rebuild it.
	Recipe string `json:"recipe,omitempty"`
}

// Store is the data directory's templates and layers.
type Store struct {
	dir string
	// spaceGuard, if set, is asked while a layer is unpacked whether the
	// data dir may take more: an image's size is the registry's (or an
	// archive's) to say, and a compressed layer can unpack to far more.
	spaceGuard func() error
}

// GuardSpace makes every layer unpack (internal/oci) call guard as it
// writes and stop with its error. Call it before the store is used.
func (s *Store) GuardSpace(guard func() error) { s.spaceGuard = guard }

// SpaceGuard is the guard GuardSpace set, or nil.
func (s *Store) SpaceGuard() func() error { return s.spaceGuard }

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidID tells whether id may name a template, a layer or a snapshot: a
// file or directory name under the data dir.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// Open returns the store in dataDir, creating its directories. What it
// creates is for root only (0700), the data dir too if it is missing:
// layers hold tenants' setuid programs.
func Open(dataDir string) (*Store, error) {
	if !filepath.IsAbs(dataDir) {
		return nil, fmt.Errorf("image: data dir %q is not absolute", dataDir)
	}
	for _, d := range []string{"layers", "templates", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(dataDir, d), 0o700); err != nil {
			return nil, err
		}
	}
	return &Store{dir: dataDir}, nil
}

// Dir is the data directory.
func (s *Store) Dir() string { return s.dir }

// LayerDir is where layer id lives.
func (s *Store) LayerDir(id string) string { return filepath.Join(s.dir, "layers", id) }

// Prefixes of the temporary dirs (LayerTemp, SnapshotTemp) that layers
// and checkpoints are written into before they are renamed into place: an
// OCI layer being unpacked (internal/oci), a sandbox's writes being
// committed (internal/rootfs), a layer or checkpoint pulled from another
// node (internal/imagepeer). Cleanup removes those nobody holds locked.
const (
	OCITempPrefix    = ".tmp-oci-"
	CommitTempPrefix = ".tmp-commit-"
	PullTempPrefix   = ".tmp-pull-"
)

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

// Templates lists the IDs of the templates (image records) in the store.
func (s *Store) Templates() ([]string, error) {
	m, err := filepath.Glob(filepath.Join(s.dir, "templates", "*.json"))
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(m))
	for _, p := range m {
		if id := strings.TrimSuffix(filepath.Base(p), ".json"); idPattern.MatchString(id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
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
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
