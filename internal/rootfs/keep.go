package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Keeping a root filesystem while its sandbox is paused, and copying it
// for a snapshot or a fork.
//
// A sandbox paused to disk keeps its directory, sandboxes/<id>/: the
// writable layer (disk.img, or upper/ and work/ without a limit), envd's
// log on it, and the checkpoint image of its memory (checkpoint/), with
// nothing mounted (Detach). Remount mounts the same writable layer again
// over the same layers, so the resumed sandbox finds its files exactly as
// it left them: a checkpoint restores only against the file system it
// was taken with. A snapshot or a fork copies the disk image (CopyDisk,
// extent by extent, holes kept) while the sandbox is frozen, and each
// sandbox restored from it gets a copy of that copy (MountCopy).

// ErrNoDisk is wrapped by CopyDisk for a root filesystem without a disk
// limit, whose writable layer is a plain directory.
var ErrNoDisk = errors.New("rootfs: the writable layer has no disk image")

// DiskImageName is the writable layer's disk image in a sandbox's dir.
const DiskImageName = "disk.img"

// Home is the sandbox's directory, sandboxes/<id>: everything of its root
// filesystem, mounted or kept.
func (r *Root) Home() string { return r.dir }

// CheckpointDir is where a paused sandbox's checkpoint image belongs: in
// its own directory, removed with it.
func (r *Root) CheckpointDir() string { return filepath.Join(r.dir, "checkpoint") }

// Detach unmounts the root filesystem and its disk and keeps their files
// (see Remount). Unlike Unmount it never detaches lazily: a mount still
// in use is an error, since its data would reach the disk image after a
// remount had already opened it. The container must be gone.
//
// The disk's file system is synced first: a process of any server on the
// host that made its own mount namespace a moment ago (runsc's sandbox and
// gofer do, before they pivot into their own root) holds a copy of this
// mount, which the unmount here does not reach, and the file system lives
// on in it, unsynced, until that process lets go. Remount waits for that.
func (r *Root) Detach() error {
	if disk := filepath.Join(r.dir, "disk"); isMountedDisk(disk) {
		if err := syncDir(disk); err != nil {
			return err
		}
	}
	for _, m := range []string{r.merged, filepath.Join(r.dir, "disk")} {
		if err := unmountNow(m); err != nil {
			return err
		}
	}
	return nil
}

// unmountNow unmounts m (if it is a mount point) and waits for the
// unmount, retrying a busy one for a moment: the last user may be a
// runtime process on its way out.
func unmountNow(m string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Unmount(m, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue // something may be stacked below: unmount until nothing is
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline):
			time.Sleep(20 * time.Millisecond)
		default:
			return fmt.Errorf("rootfs: unmounting %s: %w", m, err)
		}
	}
}

// CopyDisk writes a copy of the writable layer's disk image to dst (which
// must not exist), holes kept. The sandbox must be frozen: its file
// system is synced first, so the copy holds everything written until then.
func (r *Root) CopyDisk(dst string) error {
	img := filepath.Join(r.dir, DiskImageName)
	if _, err := os.Stat(img); err != nil {
		return fmt.Errorf("%w (%v)", ErrNoDisk, err)
	}
	if err := syncDir(filepath.Join(r.dir, "disk")); err != nil {
		return err
	}
	f, err := copySparse(img, dst)
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("rootfs: copying the disk image: %w", err)
	}
	return f.Close()
}

// DiskSizeMB is the size of a disk image, as Mount's diskSizeMB.
func DiskSizeMB(img string) (int, error) {
	fi, err := os.Stat(img)
	if err != nil {
		return 0, err
	}
	return int(fi.Size() >> 20), nil
}

// syncDir flushes the file system dir is on (syncfs).
func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("rootfs: syncing %s: %w", dir, err)
	}
	return nil
}

// Remount mounts the kept root filesystem of sandbox id (see Detach)
// again over layers, which must be the ones it was made with. Mounts an
// interrupted pause or resume left below its directory are taken down
// first. On failure nothing stays mounted and every file is kept.
func (m *Manager) Remount(ctx context.Context, id string, layers []string) (_ *Root, err error) {
	if err := checkMount(id, layers); err != nil {
		return nil, err
	}
	dir := m.sandboxDir(id)
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("rootfs: sandbox %s has no kept root filesystem: %v", id, err)
	}
	r := &Root{dir: dir, merged: filepath.Join(dir, "rootfs")}
	if err := r.Detach(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = r.Detach()
		}
	}()
	writable := dir
	if img := filepath.Join(dir, DiskImageName); exists(img) {
		writable = filepath.Join(dir, "disk")
		if err := m.waitDiskReleased(ctx, id, img); err != nil {
			return nil, err
		}
		if err := mountImage(img, writable); err != nil {
			return nil, err
		}
	}
	return r, r.mountOverlay(id, layers, writable, false)
}

// MountCopy is Mount with a copy of diskImage (CopyDisk's, of a snapshot)
// as the writable layer, of that image's size: the sandbox starts with
// the files of the sandbox the snapshot was taken of.
func (m *Manager) MountCopy(ctx context.Context, id string, layers []string, diskImage string) (_ *Root, err error) {
	if err := checkMount(id, layers); err != nil {
		return nil, err
	}
	dir := m.sandboxDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("rootfs: sandbox %s already has a root filesystem", id)
		}
		return nil, err
	}
	r := &Root{dir: dir, merged: filepath.Join(dir, "rootfs")}
	defer func() {
		if err != nil {
			_ = r.Unmount()
		}
	}()
	img := filepath.Join(dir, DiskImageName)
	f, err := copySparse(diskImage, img)
	if err != nil {
		return nil, fmt.Errorf("rootfs: copying the snapshot's disk image: %w", err)
	}
	f.Close()
	writable := filepath.Join(dir, "disk")
	if err := mountImage(img, writable); err != nil {
		return nil, err
	}
	return r, r.mountOverlay(id, layers, writable, false)
}

// Remove deletes the kept root filesystem of sandbox id (see Detach), with
// whatever is still mounted below it.
func (m *Manager) Remove(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("rootfs: invalid sandbox id %q", id)
	}
	return removeSandbox(m.sandboxDir(id))
}

// Kept returns the kept root filesystem of sandbox id (detached, see
// Detach), or false if it has none.
func (m *Manager) Kept(id string) (*Root, bool) {
	if !idPattern.MatchString(id) {
		return nil, false
	}
	dir := m.sandboxDir(id)
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return nil, false
	}
	r := &Root{dir: dir, merged: filepath.Join(dir, "rootfs"), upper: filepath.Join(dir, "upper")}
	if exists(filepath.Join(dir, DiskImageName)) {
		r.upper = filepath.Join(dir, "disk", "upper")
	}
	return r, true
}

func checkMount(id string, layers []string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("rootfs: invalid sandbox id %q", id)
	}
	if len(layers) == 0 {
		return errors.New("rootfs: a root filesystem needs at least one layer")
	}
	for _, l := range layers {
		// overlayfs separates lower dirs with ':' and options with ','.
		if !filepath.IsAbs(l) || strings.ContainsAny(l, ":,") {
			return fmt.Errorf("rootfs: layer path %q must be absolute, without ':' or ','", l)
		}
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// defaultDiskReleaseWait bounds Remount's wait for a kept disk's previous
// file system (waitDiskReleased). A runtime process holds a copy of the
// host's mounts for milliseconds, seconds on a loaded host.
const defaultDiskReleaseWait = 10 * time.Second

// waitDiskReleased waits until no loop device is backed by img: until the
// file system the sandbox had on it before Detach is gone everywhere.
// Unmounted here, it may live on in another process's mount namespace (see
// Detach), its loop device attached until then. Mounting the image again
// meanwhile, through a second loop device, would read a disk the first
// file system has not finished writing (the overlay's upper dir missing
// from it, say) and leave two file systems writing one image.
func (m *Manager) waitDiskReleased(ctx context.Context, id, img string) error {
	wait := m.diskReleaseWait
	if wait <= 0 {
		wait = defaultDiskReleaseWait
	}
	if err := waitLoopReleased(ctx, img, wait); err != nil {
		return fmt.Errorf("rootfs: the disk of %s: %w", id, err)
	}
	return nil
}

// waitLoopReleased waits up to wait until no loop device is backed by
// img.
func waitLoopReleased(ctx context.Context, img string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for interval := time.Millisecond; ; interval = min(2*interval, 50*time.Millisecond) {
		devs := loopsBacking(img)
		if len(devs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still mounted in another mount namespace (%s attached) %v after it was unmounted here; try again", strings.Join(devs, ", "), wait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for it to be released: %w", ctx.Err())
		case <-time.After(interval):
		}
	}
}

// loopsBacking lists the loop devices backed by the file img.
func loopsBacking(img string) []string {
	var out []string
	for dev, backing := range loopDevices() {
		if backing == img {
			out = append(out, dev)
		}
	}
	return out
}

// isMountedDisk tells whether dir is a sandbox disk's mount point (an
// ext4 file system on a loop device), the only kind Detach syncs.
func isMountedDisk(dir string) bool {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return isLoopExt4Root(fd, dir)
}

// HomeDir is where sandbox id's directory (Root.Home) is on this node,
// whether or not it exists: where a paused sandbox fetched from the blob
// store is unpacked.
func (m *Manager) HomeDir(id string) (string, error) {
	if !idPattern.MatchString(id) {
		return "", fmt.Errorf("rootfs: invalid sandbox id %q", id)
	}
	return m.sandboxDir(id), nil
}
