package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/mountinfo"
)

// defaultDataDir is Warren's own data directory: the base layer built there
// is reused by later test runs and by `warren setup` on the same machine.
// Tests only build the base there; their sandboxes live in temporary
// stores, out of reach of a concurrent Cleanup of the real one.
const defaultDataDir = "/var/lib/warren"

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, loop devices, chroot")
	}
}

// tinyStore is a temporary store with a one-file layer.
func tinyStore(t testing.TB) (*Store, string) {
	t.Helper()
	needRoot(t)
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	layer := s.LayerDir("l1")
	if err := os.MkdirAll(filepath.Join(layer, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "etc", "from-layer"), []byte("layer"), 0o644); err != nil {
		t.Fatal(err)
	}
	return s, layer
}

// assertGone checks that nothing of a sandbox's root filesystem is left:
// no mount, no loop device backed by its image, no directory.
func assertGone(t testing.TB, s *Store, id string) {
	t.Helper()
	dir := s.sandboxDir(id)
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	// The kernel detaches an auto-clearing loop device as the file system
	// goes; allow it a moment.
	deadline := time.Now().Add(3 * time.Second)
	for {
		backed := loopsUnder(dir)
		if len(backed) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("loop devices %v still backed by files in %s", backed, dir)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s left (%v)", dir, err)
	}
}

func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m.MountPoint)
		}
	}
	return out
}

// loopsUnder lists loop devices whose backing file is in dir, read from
// /sys/block/loop*/loop/backing_file.
func loopsUnder(dir string) []string {
	var out []string
	for dev, backing := range loopDevices() {
		if strings.HasPrefix(backing, dir+"/") {
			out = append(out, dev+"="+backing)
		}
	}
	return out
}

// tlog sends progress lines to the test log.
type tlog struct{ t testing.TB }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
