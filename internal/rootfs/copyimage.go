package rootfs

import (
	"fmt"
	"os"
)

// CopyImage copies a disk image that no one has mounted (a paused
// sandbox's, DiskImageName in its kept dir) to dst, which must not
// exist, with its holes kept: a fork of a paused sandbox restores its
// children from such a copy, as from a snapshot's (Root.CopyDisk).
func CopyImage(src, dst string) error {
	f, err := copySparse(src, dst)
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("rootfs: copying the disk image: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
