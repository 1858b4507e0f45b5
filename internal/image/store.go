// Package image keeps templates' file systems on disk and mounts a root
// filesystem for each sandbox.
//
// On-disk layout, under the data directory (default /var/lib/warren):
//
//	layers/<layerID>/             a read-only directory tree: one layer
//	layers/.build-<templateID>/   a layer being built; never used, removed
//	                              by the next build or by Cleanup
//	layers/oci-<diffID>/          an OCI image's layer, unpacked (oci.go)
//	layers/.tmp-oci-*/            one being unpacked; removed by Cleanup
//	layers/.tmp-commit-*/         a sandbox's writes being committed as a
//	                              layer (commit.go); removed by Cleanup
//	layers/step-<key>/            a template build step's layer (internal/
//	                              build): what the step wrote, committed
//	                              from its sandbox's writable layer
//	layers/snap-<key>/            the files of a build's started sandbox
//	.<templateID>.lock            flock held while that template is built
//	snapshots/<snapshotID>/       checkpoint image of a template's sandbox
//	                              with its start command running
//	uploads/<templateID>/<hash>   files uploaded for a build's COPY steps
//	templates/<templateID>.json   a template: its layer IDs (bottom first),
//	                              the defaults of its sandboxes (user,
//	                              workdir, envs, start and ready commands)
//	                              and, if built in, the recipe that made it
//	disks/ext4-<MB>M-<v>.img      a freshly formatted sparse ext4 image of
//	                              each disk size in use, copied per sandbox
//	sandboxes/<sandboxID>/        a sandbox's root filesystem while it exists:
//	  disk.img                    its sparse ext4 image of diskSizeMB
//	  disk/upper, disk/work       the overlay's writable layer, on that image
//	                              (upper/, work/ directly when no limit)
//	  disk/envd.log               envd's output (Rootfs.LogPath), bounded by
//	                              the same disk (envd.log without a limit)
//	  rootfs/                     the overlay mount: the container's root
//
// Lifecycle. A layer is built under layers/.build-<templateID> and renamed
// into place when complete: the rename is the commit, so an interrupted
// build never looks complete, and a layer dir that exists is whole. The
// template that names it is written (atomically) after the rename; a crash
// between the two only means the next call writes it. A built-in template
// records its recipe, and its layer ID includes it, so a changed recipe
// builds a new layer beside the old one, which sandboxes still running on
// it keep using. EnsureBase does this for the built-in `base` template
// (Debian 12 by debootstrap), serialised between processes by the lock
// file. Layers are shared, read-only, by every sandbox and template that
// uses them.
//
// A sandbox's root filesystem is made by Mount and removed by
// (*Rootfs).Unmount; Cleanup removes those a crashed run left behind.
//
// diskSizeMB is enforced by giving each sandbox's writable layer its own
// file system: a sparse file of that size holding ext4 (no journal, no
// resize inode, no reserved blocks), attached to a loop device
// (LOOP_CTL_GET_FREE + LOOP_CONFIGURE ioctls, no exec; auto-clear, so the
// kernel detaches it when the file system goes) and mounted; overlayfs
// puts its upper and work dirs there. Writes past the size fail with
// ENOSPC inside the sandbox and cannot fill the host's disk, and only what
// is written takes host space. The host root is ext4 without project
// quotas, so a quota on a plain directory is not an option.
//
// The data directory is root's, mode 0700 (internal/setup), and what Open
// creates is 0700: layers hold tenants' setuid programs, and no other
// local user may reach them.
//
// Tenant trees on the host. Root filesystems, layers and upper dirs are
// written by tenants, so every host access to a path inside one resolves
// it inside that tree or does not follow links at all:
//
//   - /etc/hosts and the runtime's mount points (/opt/warren/envd,
//     /etc/resolv.conf) are written by internal/node through
//     internal/rootpath (openat2 RESOLVE_IN_ROOT; links at those names are
//     replaced, never followed). The runtimes resolve mount destinations
//     inside the root themselves (runc within the rootfs, refusing /proc;
//     runsc in the sentry's own file system).
//   - runsc's /tmp bind (internal/runtime) lstats <rootfs>/tmp, a direct
//     child of the root, before the sandbox runs: a link there is not
//     followed and nothing can swap it meanwhile.
//   - OCI layers are unpacked into a private 0700 directory whose every
//     parent component is lstat-checked before an entry is made (oci.go);
//     Commit copies an upper dir with directory file descriptors and
//     O_NOFOLLOW only, after the container is gone (commit.go).
//   - Unmount, Cleanup and RemoveSnapshot unmount whatever is below a
//     tree, then remove it with os.RemoveAll, which works with unlinkat
//     and O_NOFOLLOW relative to directory descriptors: never through a
//     tenant's link.
//   - envd's log is beside the upper dir, not in it: the sandbox cannot
//     reach it. Uploads for COPY steps are plain files under uploads/,
//     named by validated IDs, and are unpacked by envd inside the build
//     sandbox, never on the host. Checkpoint images (snapshots/) are
//     written by runsc. The base layer is debootstrap's, not a tenant's.
//
// Cost, measured on the project's 2-vCPU machine (BenchmarkMountOverlay,
// BenchmarkDiskImage, BenchmarkUnmountDirty): running mkfs.ext4 per
// sandbox takes 4–6 ms (mostly its fork and exec), so each size is
// formatted once into disks/ and copied extent by extent (SEEK_DATA/
// SEEK_HOLE + copy_file_range, 0.1–0.3 ms: a fresh image holds about
// 230 KB of data whatever its size). Mount then takes 2.5–3.3 ms with a
// limit (loop attach and the ext4 mount are most of it) against 0.2–0.3 ms
// without; Unmount 4–5 ms against 1.5 ms. Unmount first shuts the sandbox's
// ext4 down (EXT4_IOC_SHUTDOWN) so that data still dirty in memory is
// dropped, not written back to a file about to be deleted: after 200 MB of
// writes it takes 18 ms instead of 350–390 ms.
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
	// Snapshot, if set, names the checkpoint image (SnapshotDir) of a
	// sandbox of these layers with StartCmd already running: sandboxes of
	// the template are restored from it instead of booted.
	Snapshot string `json:"snapshot,omitempty"`
	// SnapshotToken is the access token of the envd inside Snapshot (the
	// build sandbox's, checkpointed with it): a restored sandbox's /init
	// must present it. It is a secret: template files are 0600 in the
	// 0700 data dir.
	SnapshotToken string `json:"snapshotToken,omitempty"`
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

// GuardSpace makes every layer unpack call guard after each
// unpackGuardEvery bytes and stop with its error. Call it before the
// store is used.
func (s *Store) GuardSpace(guard func() error) { s.spaceGuard = guard }

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Open returns the store in dataDir, creating its directories. What it
// creates is for root only (0700), the data dir too if it is missing:
// layers hold tenants' setuid programs, sandboxes their files.
func Open(dataDir string) (*Store, error) {
	if !filepath.IsAbs(dataDir) {
		return nil, fmt.Errorf("image: data dir %q is not absolute", dataDir)
	}
	for _, d := range []string{"layers", "templates", "disks", "sandboxes", "snapshots"} {
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
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
