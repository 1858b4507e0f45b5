package volume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/rootfs"
)

// diskFormat names the mkfs options (diskOptions); change it with them so
// that templates formatted the old way are not reused.
const diskFormat = "v1"

// makeDisk puts a fresh ext4 image of sizeMB at dir/disk.img, all its
// blocks allocated on the host (preallocate), and mounts it at dir/fs.
// The node's reserve is asked first (Config.Reserve).
func (m *Manager) makeDisk(ctx context.Context, dir string, sizeMB int) error {
	if m.cfg.Reserve != nil {
		if err := m.cfg.Reserve(int64(sizeMB)); err != nil {
			return err
		}
	}
	tmpl, err := m.diskTemplate(ctx, sizeMB)
	if err != nil {
		return err
	}
	f, err := rootfs.CopySparse(tmpl, filepath.Join(dir, "disk.img"))
	if err != nil {
		return fmt.Errorf("volume: copying the disk image: %w", err)
	}
	err = preallocate(f)
	f.Close()
	if err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, "fs"), 0o700); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	return m.mountDisk(dir)
}

// preallocate gives the image f every block of its size on the host
// (unwritten extents: nothing is written, and what reads as zeros still
// does), so that writes into the volume never take more of the host's
// disk: a volume fills with ENOSPC inside its own file system, never
// with write errors from a host disk that filled first. Blocks already
// allocated are kept; a host disk without room fails with ErrNoSpace.
func preallocate(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, fi.Size())
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: the node's disk has no room for a volume of %d MB", ErrNoSpace, fi.Size()>>20)
	}
	if err != nil {
		return fmt.Errorf("volume: allocating the disk image: %w", err)
	}
	return nil
}

// unallocatedMB is how much of the image f has no blocks on the host.
func unallocatedMB(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return max(0, st.Size-st.Blocks*512) >> 20, nil
}

// refuseDiscard makes the loop device loop refuse discards (FITRIM):
// fstrim (Debian's weekly fstrim.timer trims every mounted file system)
// would otherwise punch the free blocks of the volume's file system out
// of its image, giving back the host blocks preallocate took.
func refuseDiscard(loop string) error {
	p := filepath.Join("/sys/block", filepath.Base(loop), "queue", "discard_max_bytes")
	return os.WriteFile(p, []byte("0"), 0)
}

// diskOptions make a volume's file system. Unlike a sandbox's disk it
// keeps its journal (a volume outlives crashes) and remounts read-only on
// errors rather than carry on writing; no reserved blocks (the volume gets
// all of its size); lazy inode tables (only metadata that is used gets
// written). The journal is zeroed here, once per size (digHoles then
// makes the zeros holes again, so that every copy stays sparse and still
// reads them as zeros).
var diskOptions = []string{"-m", "0", "-e", "remount-ro", "-E", "lazy_itable_init=1,lazy_journal_init=0,nodiscard"}

// diskTemplate returns a formatted, empty, sparse ext4 image of sizeMB in
// .disks/, formatting it the first time a size is asked for.
func (m *Manager) diskTemplate(ctx context.Context, sizeMB int) (string, error) {
	p := filepath.Join(m.cfg.Root, disksDir, fmt.Sprintf("ext4-%dM-%s.img", sizeMB, diskFormat))
	return rootfs.EmptyImage(ctx, p, sizeMB, diskOptions, digHoles)
}

// digHoles punches out every all-zero block of img's data: reads of a
// hole give zeros, so the file system is the same, and copies of it cost
// only the blocks that hold something.
func digHoles(img string) error {
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const block = 64 << 10
	buf := make([]byte, block)
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	for off := int64(0); off < fi.Size(); off += block {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		off = data - data%block
		n, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if n > 0 && allZero(buf[:n]) {
			if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n)); err != nil {
				return fmt.Errorf("volume: punching a hole: %w", err)
			}
		}
	}
	return f.Sync()
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// mountDisk mounts dir/disk.img at dir/fs unless a file system is
// mounted there already (a previous run's, or another request's). An
// image that is not wholly allocated (made by a version that kept images
// sparse, or trimmed) is allocated first if the node's reserve allows; if
// not, it is mounted as it is, and the warning says so.
func (m *Manager) mountDisk(dir string) error {
	fs := filepath.Join(dir, "fs")
	if mounted, err := isMountPoint(fs); err != nil || mounted {
		return err
	}
	img := filepath.Join(dir, "disk.img")
	// Unmounted here, the file system may live on in another process's
	// mount namespace (a runtime starting copies the host's mounts):
	// mounted again through a second loop device, it would show what that
	// one had not written back yet (a file written just before was
	// missing), and two file systems would write one image.
	if err := rootfs.WaitLoopReleased(context.Background(), img, diskReleaseWait); err != nil {
		return fmt.Errorf("volume: %s: %w", filepath.Base(dir), err)
	}
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	defer f.Close()
	if missing, err := unallocatedMB(f); err == nil && missing > 0 {
		if m.cfg.Reserve != nil {
			err = m.cfg.Reserve(missing)
		}
		if err == nil {
			err = preallocate(f)
		}
		if err != nil {
			m.log.Warn("a volume's image is mounted without all its blocks: writes into it may fail with I/O errors if the node's disk fills first", "dir", dir, "unallocated_mb", missing, "err", err)
		}
	}
	loop, err := rootfs.AttachLoop(f)
	if err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	defer loop.Close()
	if err := refuseDiscard(loop.Name()); err != nil {
		m.log.Warn("a volume's loop device still takes discards: fstrim may give its free blocks back to the host", "dir", dir, "err", err)
	}
	// nosuid, nodev: the host never runs nor opens a device in a tenant's
	// tree (the sandboxes' bind mounts say the same for them).
	// noinit_itable: the kernel would otherwise zero the unused inode
	// tables in the background, un-sparsing every image.
	if err := unix.Mount(loop.Name(), fs, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "noinit_itable"); err != nil {
		return fmt.Errorf("volume: mounting %s: %w", loop.Name(), err)
	}
	return nil
}

// diskReleaseWait bounds mountDisk's wait for the image's previous file
// system to go (rootfs.WaitLoopReleased); a variable for the tests.
var diskReleaseWait = 10 * time.Second

// isMountPoint tells whether a file system other than its parent's is
// mounted at dir.
func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, fmt.Errorf("volume: %w", err)
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("volume: %w", err)
	}
	return st.Dev != parent.Dev, nil
}

// shutDownDisk drops a deleted volume's dirty data instead of writing it
// back (internal/rootfs's guard: only an ext4 on a loop device mounted
// at dir).
func shutDownDisk(dir string) { rootfs.ShutDownDisk(dir) }
