package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/lockfile"
	"github.com/warren-sandbox/warren/internal/mountinfo"
)

// Cleanup opens the store in dataDir and removes what a crashed run left
// there; see (*Store).Cleanup.
func Cleanup(dataDir string, known func(sandboxID string) bool) error {
	s, err := Open(dataDir)
	if err != nil {
		return err
	}
	return s.Cleanup(known)
}

// Cleanup removes what a crashed run left behind: the root filesystems
// (mounts, loop devices, files) of sandboxes that known does not
// recognise (nil: none), interrupted layer builds, image layer unpacks
// and commits (layers/.tmp-oci-*, layers/.tmp-commit-*) nobody is running, and half-formatted or outdated
// disk images. Call it before mounting anything.
func (s *Store) Cleanup(known func(sandboxID string) bool) error {
	isKnown := func(id string) bool { return known != nil && known(id) }
	var errs []error
	entries, err := os.ReadDir(filepath.Join(s.dir, "sandboxes"))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !isKnown(e.Name()) {
			errs = append(errs, removeSandbox(s.sandboxDir(e.Name())))
		}
	}
	errs = append(errs, s.clearLoops(isKnown))
	errs = append(errs, s.removeStaleBuilds())
	errs = append(errs, s.removeStaleTemps())
	// A format takes milliseconds, so an old temporary image is a crash's;
	// an image of another format version will never be used again.
	tmps, _ := filepath.Glob(filepath.Join(s.dir, "disks", ".tmp-*"))
	for _, t := range tmps {
		if fi, err := os.Stat(t); err == nil && time.Since(fi.ModTime()) > time.Minute {
			errs = append(errs, os.Remove(t))
		}
	}
	imgs, _ := filepath.Glob(filepath.Join(s.dir, "disks", "ext4-*.img"))
	for _, img := range imgs {
		if !strings.HasSuffix(img, "-"+diskFormat+".img") {
			errs = append(errs, os.Remove(img))
		}
	}
	return errors.Join(errs...)
}

// clearLoops detaches loop devices backed by an image in sandboxes/ of a
// sandbox that is not known. Autoclear normally does it when the disk is
// unmounted, but a device can outlive that, e.g. when another mount
// namespace still held the file system. LOOP_CLR_FD on a device still in
// use only marks it for autoclear, so this never pulls a disk from under a
// live mount.
func (s *Store) clearLoops(isKnown func(string) bool) error {
	prefix := filepath.Join(s.dir, "sandboxes") + "/"
	var errs []error
	for dev, backing := range loopDevices() {
		rest, ok := strings.CutPrefix(backing, prefix)
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(rest, "/")
		if isKnown(id) {
			continue
		}
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
			errs = append(errs, fmt.Errorf("image: detaching %s (%s): %w", dev, backing, err))
		}
		f.Close()
	}
	return errors.Join(errs...)
}

// loopDevices maps attached loop devices (/dev/loopN) to their backing
// files, as sysfs reports them (without the " (deleted)" suffix of an
// unlinked file).
func loopDevices() map[string]string {
	out := map[string]string{}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		name := filepath.Base(filepath.Dir(filepath.Dir(f)))
		out["/dev/"+name] = strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
	}
	return out
}

// removeStaleBuilds removes layers/.build-<templateID> directories whose
// template's build lock is free: a build that was interrupted. A build in
// progress holds the lock and is left alone.
func (s *Store) removeStaleBuilds() error {
	builds, _ := filepath.Glob(filepath.Join(s.dir, "layers", ".build-*"))
	var errs []error
	for _, b := range builds {
		tid := strings.TrimPrefix(filepath.Base(b), ".build-")
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // one non-blocking try
		unlock, err := lockfile.Acquire(ctx, s.buildLock(tid))
		if err != nil {
			continue
		}
		errs = append(errs, removeTree(b))
		unlock()
	}
	return errors.Join(errs...)
}

// removeTree unmounts whatever is mounted at or below dir, deepest first,
// and removes it. If a mount cannot be removed it fails rather than
// delete files through it.
func removeTree(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	below, err := mountsBelow(dir)
	if err != nil {
		return err
	}
	for _, m := range below {
		if err := unmount(m); err != nil {
			return err
		}
	}
	if left, err := mountsBelow(dir); err != nil || len(left) > 0 {
		return fmt.Errorf("image: %s still has mounts %v (%v)", dir, left, err)
	}
	return os.RemoveAll(dir)
}

// unmount unmounts m if it is a mount point. A busy mount (a process still
// has a file open in it) is detached instead: it disappears from the tree
// at once and the kernel frees it when its last user goes.
func unmount(m string) error {
	err := unix.Unmount(m, 0)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil // unmounted, or not a mount point
	case errors.Is(err, unix.EBUSY):
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("image: detaching %s: %w", m, err)
		}
		return nil
	default:
		return fmt.Errorf("image: unmounting %s: %w", m, err)
	}
}

// mountsBelow lists the mount points at or below dir, deepest first (a
// mount stacked on another comes later in mountinfo, so it is listed
// first among equals).
func mountsBelow(dir string) ([]string, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	var out []string
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i].MountPoint
		if m == dir || strings.HasPrefix(m, dir+"/") {
			out = append(out, m)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}
