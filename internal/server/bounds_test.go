package server

import (
	"testing"

	"github.com/warren-sandbox/warren/internal/runtime"
)

func TestSandboxBoundFlags(t *testing.T) {
	if err := checkSandboxBounds(Config{SandboxMaxConns: 8192, SandboxConnRate: 0}); err != nil {
		t.Errorf("valid bounds: %v", err)
	}
	for _, bad := range []Config{{SandboxMaxConns: -1}, {SandboxConnRate: -5}, {SandboxDiskReadMBps: -1}, {SandboxDiskWriteMBps: -1}, {SandboxDiskIOPS: -1}} {
		if err := checkSandboxBounds(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	// The flags' 0 is "no bound", network.Config's is "the default".
	if noBoundIfZero(0) != -1 || noBoundIfZero(300) != 300 {
		t.Error("noBoundIfZero")
	}
	got := diskIO(Config{SandboxDiskReadMBps: 256, SandboxDiskWriteMBps: 128, SandboxDiskIOPS: 4000})
	want := runtime.DiskIO{ReadBytesPerSec: 256 << 20, WriteBytesPerSec: 128 << 20, ReadIOPS: 4000, WriteIOPS: 4000}
	if got != want {
		t.Errorf("diskIO: %+v; want %+v", got, want)
	}
}
