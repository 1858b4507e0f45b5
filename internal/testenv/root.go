package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// NeedRoot skips the test unless it runs as root (mounts, loop devices,
// chroot, namespaces).
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, loop devices, chroot")
	}
}

// WriteTinyLayer makes dir a one-file layer: etc/from-layer holding
// "layer".
func WriteTinyLayer(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "from-layer"), []byte("layer"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Log is a writer of progress lines into the test's log.
func Log(t testing.TB) *LogWriter { return &LogWriter{t} }

// LogWriter sends what is written to it, line by line, to a test's log.
type LogWriter struct{ t testing.TB }

func (w *LogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
