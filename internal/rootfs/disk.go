package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// diskFormat names the mkfs options of a sandbox disk (diskOptions);
// change it with them so that images formatted the old way are not reused.
const diskFormat = "v2"

// diskOptions make a sandbox's disk: no journal (the disk dies with its
// sandbox, so crash consistency buys nothing), lazy init (only metadata
// that is used gets written: the file stays sparse), no reserved blocks
// (the sandbox gets all of its size), no discard (nothing to discard in a
// new sparse file).
var diskOptions = []string{"-m", "0", "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"}

// diskTemplate returns a formatted, empty, sparse ext4 image of sizeMB in
// disks/, formatting it the first time a size is asked for.
func (m *Manager) diskTemplate(ctx context.Context, sizeMB int) (string, error) {
	p := filepath.Join(m.dir, "disks", fmt.Sprintf("ext4-%dM-%s.img", sizeMB, diskFormat))
	return EmptyImage(ctx, p, sizeMB, diskOptions, nil)
}

// EmptyImage returns path, an empty ext4 image of sizeMB that mkfs.ext4
// makes with options (then finish, if set, on the new file), made the
// first time it is asked for. Concurrent first calls may both make it;
// each renames a complete image into place, so a reader only ever sees a
// whole one. Copies of it (CopySparse) are the disks.
func EmptyImage(ctx context.Context, path string, sizeMB int, options []string, finish func(img string) error) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*.img")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	err = f.Truncate(int64(sizeMB) << 20)
	f.Close()
	if err == nil {
		err = mkfs(ctx, tmp, options)
	}
	if err == nil && finish != nil {
		err = finish(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return path, nil
}

// mkfs runs mkfs.ext4 with options on img.
func mkfs(ctx context.Context, img string, options []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mkfs.ext4", append(append([]string{"-q", "-F"}, options...), img)...)
	// As every command of the image packages: killed with its process
	// group, and its output pipes not waited on for long.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("rootfs: mkfs.ext4: %v: %s", err, out)
	}
	return nil
}

// copySparse creates dst (it must not exist) as a copy of src that has
// holes where src has them: only src's data extents are copied (by
// copy_file_range, through io.Copy). It returns dst open for reading and
// writing.
func copySparse(src, dst string) (_ *os.File, err error) {
	in, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return nil, err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			out.Close()
		}
	}()
	if err := copyExtents(in, out, fi.Size()); err != nil {
		return nil, err
	}
	return out, nil
}

// copyExtents makes out, an empty file, a copy of in (size bytes) with
// holes where in has them: only in's data extents are copied (by
// copy_file_range, through io.Copy), so a sparse file of any apparent
// size costs only what it holds.
func copyExtents(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // only a hole is left
			break
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		// *os.File to *os.File through a LimitedReader: copy_file_range.
		if _, err := io.Copy(out, io.LimitReader(in, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// attachLoop binds a free loop device to f with autoclear set: the kernel
// detaches it when the last user goes (the file system mounted on it, or
// the returned file if nothing is mounted). The ioctls avoid a fork and
// exec of losetup. The caller closes the returned device once it is
// mounted (or to give it up).
func attachLoop(f *os.File) (*os.File, error) {
	// GET_FREE hands the same device to concurrent callers until one has
	// configured it: serialise this process's attaches (about 1 ms each),
	// and retry only for other processes.
	loopMu.Lock()
	defer loopMu.Unlock()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	const attempts = 50
	for attempt := 0; attempt < attempts; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("rootfs: finding a free loop device: %w", err)
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
			return nil, fmt.Errorf("rootfs: configuring loop device: %w", err)
		}
		// Another process took it between GET_FREE and CONFIGURE: retry.
		time.Sleep(time.Duration(attempt) * time.Millisecond)
	}
	return nil, fmt.Errorf("rootfs: no free loop device after %d attempts", attempts)
}

var loopMu sync.Mutex
