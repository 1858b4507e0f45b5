// Package rootfs mounts each sandbox's root filesystem: an overlay of its
// template's read-only layers (internal/image) under a writable layer of
// its own, limited to diskSizeMB by an ext4 disk image; and commits what a
// sandbox wrote as a new layer (a template build step).
//
// On-disk layout, under the data directory (default /var/lib/warren):
//
//	disks/ext4-<MB>M-<v>.img      a freshly formatted sparse ext4 image of
//	                              each disk size in use, copied per sandbox
//	sandboxes/<sandboxID>/        a sandbox's root filesystem while it exists:
//	  disk.img                    its sparse ext4 image of diskSizeMB
//	  disk/upper, disk/work       the overlay's writable layer, on that image
//	                              (upper/, work/ directly when no limit)
//	  disk/envd.log               envd's output (Root.LogPath), bounded by
//	                              the same disk (envd.log without a limit)
//	  rootfs/                     the overlay mount: the container's root
//	  checkpoint/                 the checkpoint image of its memory while
//	                              it is paused (written by the runtime)
//
// A sandbox's root filesystem is made by Mount (or MountCopy, from a
// snapshot's disk image) and removed by (*Root).Unmount; Cleanup removes
// those a crashed run left behind. A paused sandbox's is kept unmounted
// (Detach) and mounted again by Remount (keep.go). Commit copies a
// sandbox's writable layer into layers/ through the image store
// (commit.go).
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
// What Open creates is 0700, as the data dir is (internal/setup): root
// filesystems hold tenants' setuid programs, and no other local user may
// reach them.
//
// Tenant trees on the host. Root filesystems and upper dirs are written by
// tenants, so every host access to a path inside one resolves it inside
// that tree or does not follow links at all: /etc/hosts and the runtime's
// mount points are written by internal/node through internal/rootpath;
// Commit copies an upper dir with directory file descriptors and
// O_NOFOLLOW only, after the container is gone; Unmount and Cleanup
// unmount whatever is below a tree, then remove it with os.RemoveAll,
// which works with unlinkat and O_NOFOLLOW relative to directory
// descriptors: never through a tenant's link. envd's log is beside the
// upper dir, not in it: the sandbox cannot reach it.
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
package rootfs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// Manager mounts and removes the root filesystems of the sandboxes of one
// data directory.
type Manager struct {
	dir string
	// diskReleaseWait bounds how long Remount waits for a kept disk's
	// previous file system to go (diskReleased).
	diskReleaseWait time.Duration
}

// idPattern is what a sandbox ID must look like to name a directory here.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Open returns the manager of dataDir's root filesystems, creating its
// directories (sandboxes/, disks/) for root only (0700), the data dir too
// if it is missing.
func Open(dataDir string) (*Manager, error) {
	if !filepath.IsAbs(dataDir) {
		return nil, fmt.Errorf("rootfs: data dir %q is not absolute", dataDir)
	}
	for _, d := range []string{"disks", "sandboxes"} {
		if err := os.MkdirAll(filepath.Join(dataDir, d), 0o700); err != nil {
			return nil, err
		}
	}
	return &Manager{dir: dataDir}, nil
}

func (m *Manager) sandboxDir(id string) string { return filepath.Join(m.dir, "sandboxes", id) }
