package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Cleanup removes what a crashed run left behind: the root filesystems
// (mounts, loop devices, files) of sandboxes that known does not
// recognise (nil: none), and half-formatted or outdated disk images. Call
// it before mounting anything.
func (m *Manager) Cleanup(known func(sandboxID string) bool) error {
	isKnown := func(id string) bool { return known != nil && known(id) }
	var errs []error
	entries, err := os.ReadDir(filepath.Join(m.dir, "sandboxes"))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !isKnown(e.Name()) {
			errs = append(errs, removeSandbox(m.sandboxDir(e.Name())))
		}
	}
	errs = append(errs, m.clearLoops(isKnown))
	// A format takes milliseconds, so an old temporary image is a crash's;
	// an image of another format version will never be used again.
	tmps, _ := filepath.Glob(filepath.Join(m.dir, "disks", ".tmp-*"))
	for _, t := range tmps {
		if fi, err := os.Stat(t); err == nil && time.Since(fi.ModTime()) > time.Minute {
			errs = append(errs, os.Remove(t))
		}
	}
	imgs, _ := filepath.Glob(filepath.Join(m.dir, "disks", "ext4-*.img"))
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
func (m *Manager) clearLoops(isKnown func(string) bool) error {
	prefix := filepath.Join(m.dir, "sandboxes") + "/"
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
			errs = append(errs, fmt.Errorf("rootfs: detaching %s (%s): %w", dev, backing, err))
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
