package rootfs

import (
	"context"
	"os"
	"time"
)

// What other packages keeping ext4 images on loop devices use of this
// one's (internal/volume: a volume with a quota is such an image).

// CopySparse creates dst (it must not exist) as a copy of src with holes
// where src has them, and returns it open for reading and writing.
func CopySparse(src, dst string) (*os.File, error) { return copySparse(src, dst) }

// AttachLoop binds a free loop device to f with autoclear set, and
// returns the device; close it once the file system on it is mounted.
func AttachLoop(f *os.File) (*os.File, error) { return attachLoop(f) }

// ShutDownDisk makes the ext4 file system on a loop device mounted at
// dir drop its dirty data instead of writing it back, before the caller
// unmounts it and deletes its image. It does nothing unless dir is such a
// mount.
func ShutDownDisk(dir string) { shutDownDisk(dir) }

// WaitLoopReleased waits up to wait until no loop device is backed by the
// image img: until a file system mounted from it, unmounted here, is gone
// from every other mount namespace too. Mounting the image again before
// that, through a second loop device, would read what the first file
// system has not written back yet, and leave two writing one image.
func WaitLoopReleased(ctx context.Context, img string, wait time.Duration) error {
	return waitLoopReleased(ctx, img, wait)
}
