package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/mountinfo"
)

// Rootfs is a sandbox's mounted root filesystem.
type Rootfs struct {
	dir    string // sandboxes/<id>
	merged string
	upper  string
}

// Dir is the overlay mount, the container's root.
func (r *Rootfs) Dir() string { return r.merged }

// UpperDir holds what the sandbox wrote.
func (r *Rootfs) UpperDir() string { return r.upper }

func (s *Store) sandboxDir(id string) string { return filepath.Join(s.dir, "sandboxes", id) }

// Mount mounts a root filesystem for sandbox id: an overlay of layers
// (directories, bottom first) under a writable layer limited to
// diskSizeMB (0: no limit). On failure nothing of it is left.
func (s *Store) Mount(ctx context.Context, id string, layers []string, diskSizeMB int) (_ *Rootfs, err error) {
	if !idPattern.MatchString(id) {
		return nil, fmt.Errorf("image: invalid sandbox id %q", id)
	}
	if len(layers) == 0 {
		return nil, errors.New("image: a root filesystem needs at least one layer")
	}
	if diskSizeMB < 0 {
		return nil, fmt.Errorf("image: diskSizeMB %d is negative", diskSizeMB)
	}
	dir := s.sandboxDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("image: sandbox %s already has a root filesystem", id)
		}
		return nil, err
	}
	r := &Rootfs{dir: dir, merged: filepath.Join(dir, "rootfs")}
	defer func() {
		if err != nil {
			_ = r.Unmount()
		}
	}()
	writable := dir
	if diskSizeMB > 0 {
		writable = filepath.Join(dir, "disk")
		if err := mountDisk(ctx, filepath.Join(dir, "disk.img"), writable, diskSizeMB); err != nil {
			return nil, err
		}
	}
	r.upper = filepath.Join(writable, "upper")
	work := filepath.Join(writable, "work")
	for _, d := range []string{r.upper, work, r.merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	lower := make([]string, len(layers))
	for i, l := range layers {
		lower[len(layers)-1-i] = l // overlayfs lists the top layer first
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lower, ":"), r.upper, work)
	if err := unix.Mount("overlay", r.merged, "overlay", 0, opts); err != nil {
		return nil, fmt.Errorf("image: mounting the overlay for %s: %w", id, err)
	}
	return r, nil
}

// mountDisk creates a sparse ext4 image of sizeMB at img and mounts it at
// target through an auto-clearing loop device, which the kernel detaches
// when the file system is unmounted.
func mountDisk(ctx context.Context, img, target string, sizeMB int) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(int64(sizeMB) << 20); err != nil {
		return err
	}
	// No journal (the disk dies with the sandbox), lazy init (only what is
	// written takes space), no reserved blocks (the sandbox gets all of it).
	mkfs := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", img)
	if out, err := mkfs.CombinedOutput(); err != nil {
		return fmt.Errorf("image: mkfs.ext4: %v: %s", err, out)
	}
	loop, err := attachLoop(f)
	if err != nil {
		return err
	}
	defer loop.Close()
	if err := os.Mkdir(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(loop.Name(), target, "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("image: mounting %s: %w", loop.Name(), err)
	}
	return nil
}

// attachLoop binds a free loop device to f with autoclear set. The caller
// closes the returned device once it is mounted (or to give it up).
func attachLoop(f *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	for attempt := 0; attempt < 10; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("image: finding a free loop device: %w", err)
		}
		dev, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		cfg := &unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], f.Name())
		err = unix.IoctlLoopConfigure(int(dev.Fd()), cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("image: configuring loop device: %w", err)
		}
		// Another process took it between GET_FREE and CONFIGURE: retry.
	}
	return nil, errors.New("image: no free loop device after 10 attempts")
}

// Unmount removes the overlay, the disk image and the sandbox's directory.
// It is safe to call again after a partial failure.
func (r *Rootfs) Unmount() error {
	if err := unmountBelow(r.dir); err != nil {
		return err
	}
	return os.RemoveAll(r.dir)
}

// Cleanup removes the root filesystems of sandboxes that known does not
// recognise: what a crashed previous run left behind.
func (s *Store) Cleanup(known func(id string) bool) error {
	entries, err := os.ReadDir(filepath.Join(s.dir, "sandboxes"))
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if known != nil && known(e.Name()) {
			continue
		}
		r := &Rootfs{dir: s.sandboxDir(e.Name())}
		errs = append(errs, r.Unmount())
	}
	return errors.Join(errs...)
}

// unmountBelow unmounts every mount point at or below dir, deepest first.
func unmountBelow(dir string) error {
	mounts, err := mountPoints()
	if err != nil {
		return err
	}
	var below []string
	for _, m := range mounts {
		if m == dir || strings.HasPrefix(m, dir+"/") {
			below = append(below, m)
		}
	}
	sort.Slice(below, func(i, j int) bool { return len(below[i]) > len(below[j]) })
	for _, m := range below {
		if err := unix.Unmount(m, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			// Busy (a process still has it open): detach it lazily so the
			// directory can go; the kernel frees it when the last user ends.
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("image: unmounting %s: %w", m, err)
			}
		}
	}
	return nil
}

// mountPoints lists the mount points of this mount namespace.
func mountPoints() ([]string, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(mounts))
	for i, m := range mounts {
		out[i] = m.MountPoint
	}
	return out, nil
}
