package rootfs

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// defaultDataDir is Warren's own data directory: the base layer built there
// is reused by later test runs and by `warren setup` on the same machine.
// Tests only build the base there; their sandboxes live in temporary
// stores, out of reach of a concurrent Cleanup of the real one.
const defaultDataDir = "/var/lib/warren"

// testStore is a data dir's image store (layers) and root filesystems.
type testStore struct {
	*Manager
	*image.Store
}

// openStore opens both in dir.
func openStore(t testing.TB, dir string) testStore {
	t.Helper()
	layers, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return testStore{m, layers}
}

// tinyStore is a temporary store with a one-file layer.
func tinyStore(t testing.TB) (testStore, string) {
	t.Helper()
	testenv.NeedRoot(t)
	s := openStore(t, t.TempDir())
	layer := s.LayerDir("l1")
	testenv.WriteTinyLayer(t, layer)
	return s, layer
}

// assertGone checks that nothing of a sandbox's root filesystem is left:
// no mount, no loop device backed by its image, no directory.
func assertGone(t testing.TB, s testStore, id string) {
	t.Helper()
	dir := s.sandboxDir(id)
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	// The kernel detaches an auto-clearing loop device as the file system
	// goes; allow it a moment.
	var backed []string
	if !poll.Within(3*time.Second, 10*time.Millisecond, func() bool { backed = loopsUnder(dir); return len(backed) == 0 }) {
		t.Errorf("loop devices %v still backed by files in %s", backed, dir)
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
