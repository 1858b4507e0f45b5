package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Disk IO bounds.
//
// A sandbox's writable layer is a file system of its own on a loop device
// (internal/rootfs), or, without a disk size, the data dir's file system.
// Spec.DiskIO bounds the bytes and operations per second that the
// sandbox's cgroup submits to that block device: the OCI spec's
// blockIO throttles, which the runtime writes to blkio.throttle.* (cgroup
// v1) or io.max (cgroup v2) of the sandbox's cgroup. runsc puts its
// sandbox and gofer processes, which do the file IO for the sandbox's
// programs, in that cgroup, so they are bounded as runc's processes are.
//
// What the kernel bounds, and what it does not:
//   - Reads, O_DIRECT writes and the writes an fsync or sync starts are
//     submitted by the sandbox's tasks and bounded.
//   - Buffered writes that the kernel writes back later are submitted by
//     its flusher threads: cgroup v1 does not charge them to the sandbox,
//     so they are bounded only by the disk size (and the memory limit,
//     which bounds the dirty pages). cgroup v2 with the memory and io
//     controllers together does charge them.
//   - A loop device's own IO to its backing file is the loop driver's,
//     on the data dir's device; it follows from the bounded IO on the
//     loop device, so it is bounded by it too.
//   - Volumes (bind mounts) are on other devices and not bounded here.

// DiskIO bounds a sandbox's IO on the block device of its disk; a zero
// field is no bound.
type DiskIO struct {
	ReadBytesPerSec, WriteBytesPerSec uint64
	ReadIOPS, WriteIOPS               uint64
}

// IsZero reports whether d bounds nothing.
func (d DiskIO) IsZero() bool { return d == DiskIO{} }

// Device is a block device's number.
type Device struct{ Major, Minor uint32 }

func (d Device) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// BlockDeviceOf returns the whole block device (never a partition: the
// kernel throttles whole disks only) of the file system that holds path.
// It reports false for file systems on no block device (tmpfs, overlay,
// NFS): there is nothing to bound there.
func BlockDeviceOf(path string) (Device, bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, false, fmt.Errorf("runtime: %w", &os.PathError{Op: "stat", Path: path, Err: err})
	}
	dev := Device{unix.Major(st.Dev), unix.Minor(st.Dev)}
	if dev.Major == 0 { // anonymous: no block device under it
		return Device{}, false, nil
	}
	sys := filepath.Join("/sys/dev/block", dev.String())
	if _, err := os.Stat(sys); errors.Is(err, os.ErrNotExist) {
		return Device{}, false, nil // e.g. a device-mapper target gone, or not a block device
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		// /sys/dev/block/M:m of a partition is .../<disk>/<partition>.
		data, err := os.ReadFile(filepath.Join(sys, "..", "dev"))
		if err != nil {
			return Device{}, false, fmt.Errorf("runtime: the disk of partition %s: %w", dev, err)
		}
		if dev, err = parseDevice(strings.TrimSpace(string(data))); err != nil {
			return Device{}, false, err
		}
	}
	return dev, true, nil
}

func parseDevice(s string) (Device, error) {
	maj, min, ok := strings.Cut(s, ":")
	a, err1 := strconv.ParseUint(maj, 10, 32)
	b, err2 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return Device{}, fmt.Errorf("runtime: %q is no major:minor", s)
	}
	return Device{uint32(a), uint32(b)}, nil
}

// blockIO is the OCI spec's blockIO for a sandbox: throttles of its disk's
// device, nil when it has none.
func blockIO(s *Spec) *specs.LinuxBlockIO {
	if s.DiskDevice == (Device{}) || s.DiskIO.IsZero() {
		return nil
	}
	dev := specs.LinuxBlockIODevice{Major: int64(s.DiskDevice.Major), Minor: int64(s.DiskDevice.Minor)}
	throttle := func(rate uint64) []specs.LinuxThrottleDevice {
		if rate == 0 {
			return nil
		}
		return []specs.LinuxThrottleDevice{{LinuxBlockIODevice: dev, Rate: rate}}
	}
	return &specs.LinuxBlockIO{
		ThrottleReadBpsDevice:   throttle(s.DiskIO.ReadBytesPerSec),
		ThrottleWriteBpsDevice:  throttle(s.DiskIO.WriteBytesPerSec),
		ThrottleReadIOPSDevice:  throttle(s.DiskIO.ReadIOPS),
		ThrottleWriteIOPSDevice: throttle(s.DiskIO.WriteIOPS),
	}
}
