package node

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/warren-sandbox/warren/internal/runtime"
)

// The node's disk IO bounds go into the spec, on the block device of the
// file system that holds the sandbox's log (its writable layer).
func TestBoundDiskIO(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "envd.log")
	if err := os.WriteFile(log, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want, ok, err := runtime.BlockDeviceOf(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Skipf("%s is on no block device here", dir)
	}
	bounds := runtime.DiskIO{ReadBytesPerSec: 1 << 20, WriteIOPS: 10}
	var spec runtime.Spec
	if err := (&Node{cfg: Config{DiskIO: bounds}}).boundDiskIO(&spec, log); err != nil {
		t.Fatal(err)
	}
	if spec.DiskIO != bounds || spec.DiskDevice != want {
		t.Errorf("spec bounds %+v on %v; want %+v on %v", spec.DiskIO, spec.DiskDevice, bounds, want)
	}
	// No bounds configured: nothing in the spec.
	spec = runtime.Spec{}
	if err := (&Node{}).boundDiskIO(&spec, log); err != nil || spec.DiskDevice != (runtime.Device{}) {
		t.Errorf("without bounds: %+v, %v", spec.DiskDevice, err)
	}
	// A log on tmpfs (no block device): no bound, no error.
	spec = runtime.Spec{}
	if err := (&Node{cfg: Config{DiskIO: bounds}}).boundDiskIO(&spec, "/dev/shm/envd.log"); err != nil || spec.DiskDevice != (runtime.Device{}) {
		t.Errorf("on tmpfs: %+v, %v", spec.DiskDevice, err)
	}
}
