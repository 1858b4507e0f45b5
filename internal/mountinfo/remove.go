package mountinfo

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// RemoveTree unmounts whatever is mounted at or below dir, deepest first,
// and removes it. If a mount cannot be removed it fails rather than
// delete files through it.
func RemoveTree(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	below, err := Below(dir)
	if err != nil {
		return err
	}
	for _, m := range below {
		if err := Unmount(m); err != nil {
			return err
		}
	}
	if left, err := Below(dir); err != nil || len(left) > 0 {
		return fmt.Errorf("mountinfo: %s still has mounts %v (%v)", dir, left, err)
	}
	return os.RemoveAll(dir)
}

// Unmount unmounts m if it is a mount point. A busy mount (a process still
// has a file open in it) is detached instead: it disappears from the tree
// at once and the kernel frees it when its last user goes.
func Unmount(m string) error {
	err := unix.Unmount(m, 0)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil // unmounted, or not a mount point
	case errors.Is(err, unix.EBUSY):
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("mountinfo: detaching %s: %w", m, err)
		}
		return nil
	default:
		return fmt.Errorf("mountinfo: unmounting %s: %w", m, err)
	}
}

// Below lists the mount points at or below dir, deepest first (a mount
// stacked on another comes later in mountinfo, so it is listed first
// among equals).
func Below(dir string) ([]string, error) {
	mounts, err := Read()
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
