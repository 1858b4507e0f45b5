package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBlockDeviceOf(t *testing.T) {
	// tmpfs (or any anonymous device) has no block device to bound.
	if _, ok, err := BlockDeviceOf("/dev/shm"); err != nil || ok {
		t.Errorf("/dev/shm: ok=%v, %v; want no block device", ok, err)
	}
	if _, _, err := BlockDeviceOf("/no/such/path"); err == nil {
		t.Error("a missing path gave no error")
	}
	dev, ok, err := BlockDeviceOf(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Skipf("%s is on no block device here", os.TempDir())
	}
	// Whole disks only: the kernel refuses throttles on a partition.
	sys := filepath.Join("/sys/dev/block", dev.String())
	if _, err := os.Stat(sys); err != nil {
		t.Fatalf("%s of %s: %v", dev, os.TempDir(), err)
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		t.Errorf("%s is a partition, not its disk", dev)
	}
}

// The bounds reach the sandbox's cgroup: blkio.throttle.* under cgroup v1,
// io.max under v2, for the device given, with both backends.
func TestDiskIOBound(t *testing.T) {
	dev, ok, err := BlockDeviceOf(fixtureDirOrTemp())
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Skip("the test's files are on no block device")
	}
	want := DiskIO{ReadBytesPerSec: 50 << 20, WriteBytesPerSec: 20 << 20, ReadIOPS: 1500, WriteIOPS: 700}
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			rt := newTestRuntime(t, name)
			sb := newSpec(t, fmt.Sprintf("dio-%s-%d", name, os.Getpid()))
			sb.spec.DiskIO, sb.spec.DiskDevice = want, dev
			t.Cleanup(func() { rt.Delete(context.Background(), sb.spec.ID) })
			if err := rt.Start(context.Background(), sb.spec); err != nil {
				t.Fatalf("Start: %v", err)
			}
			b := baseOf(rt)
			dir, v2, ok := b.cgroups.dir("blkio", b.cgroupPath(sb.spec.ID))
			if !ok {
				t.Skip("this host has no blkio or io cgroup controller")
			}
			read := func(file string) string {
				data, err := os.ReadFile(filepath.Join(dir, file))
				if err != nil {
					t.Fatal(err)
				}
				return string(data)
			}
			if v2 {
				line := fmt.Sprintf("%s rbps=%d wbps=%d riops=%d wiops=%d", dev, want.ReadBytesPerSec, want.WriteBytesPerSec, want.ReadIOPS, want.WriteIOPS)
				if got := read("io.max"); !strings.Contains(got, line) {
					t.Errorf("io.max is %q; want the line %q", got, line)
				}
				return
			}
			for file, rate := range map[string]uint64{
				"blkio.throttle.read_bps_device":   want.ReadBytesPerSec,
				"blkio.throttle.write_bps_device":  want.WriteBytesPerSec,
				"blkio.throttle.read_iops_device":  want.ReadIOPS,
				"blkio.throttle.write_iops_device": want.WriteIOPS,
			} {
				line := fmt.Sprintf("%s %d", dev, rate)
				if got := read(file); !strings.Contains(got, line) {
					t.Errorf("%s is %q; want the line %q", file, got, line)
				}
			}
		})
	}
}

// fixtureDirOrTemp is where the test's sandbox files are.
func fixtureDirOrTemp() string {
	if fixtureDir != "" {
		return fixtureDir
	}
	return os.TempDir()
}

// Without a device or without bounds the spec has no blockIO at all.
func TestBlockIOSpec(t *testing.T) {
	bounds := DiskIO{ReadBytesPerSec: 1, WriteIOPS: 2}
	if blockIO(&Spec{DiskIO: bounds}) != nil || blockIO(&Spec{DiskDevice: Device{7, 3}}) != nil {
		t.Error("a blockIO without both a device and a bound")
	}
	b := blockIO(&Spec{DiskIO: bounds, DiskDevice: Device{7, 3}})
	if b == nil || len(b.ThrottleReadBpsDevice) != 1 || len(b.ThrottleWriteIOPSDevice) != 1 ||
		b.ThrottleWriteBpsDevice != nil || b.ThrottleReadIOPSDevice != nil {
		t.Fatalf("blockIO: %+v", b)
	}
	if d := b.ThrottleReadBpsDevice[0]; d.Major != 7 || d.Minor != 3 || d.Rate != 1 {
		t.Errorf("read bps throttle: %+v", d)
	}
}
