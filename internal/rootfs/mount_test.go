package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// baseLayers returns the layers of the base template in Warren's data
// directory, building it if needed (see baseimage.TestEnsureBase).
func baseLayers(t *testing.T) []string {
	t.Helper()
	testenv.NeedRoot(t)
	s, err := image.Open(defaultDataDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tmpl, err := baseimage.Ensure(ctx, s, baseimage.Options{}, testenv.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := s.LayerDirs(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

func TestMountOverBaseWithDiskLimit(t *testing.T) {
	layers := baseLayers(t)
	s := openStore(t, t.TempDir()) // sandboxes out of the real data dir's Cleanup
	r, err := s.Mount(context.Background(), "sb1", layers, 64)
	if err != nil {
		t.Fatal(err)
	}
	unmounted := false
	defer func() {
		if !unmounted {
			r.Unmount()
		}
	}()
	if r.Dir() != filepath.Join(s.Dir(), "sandboxes/sb1/rootfs") || r.UpperDir() != filepath.Join(s.Dir(), "sandboxes/sb1/disk/upper") {
		t.Errorf("paths %s %s", r.Dir(), r.UpperDir())
	}
	if _, err := os.Stat(filepath.Join(r.Dir(), "usr/bin/python3")); err != nil {
		t.Fatalf("base content not visible: %v", err)
	}

	// Writes land in the upper dir, the base is untouched, also when a
	// base file is changed (copy-up).
	if err := os.WriteFile(filepath.Join(r.Dir(), "home/user/new"), []byte("sandbox"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.Dir(), "etc/hostname"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(r.UpperDir(), "home/user/new")); err != nil || string(b) != "sandbox" {
		t.Errorf("write did not land in the upper dir: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(layers[0], "home/user/new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("write reached the base: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(layers[0], "etc/hostname")); string(b) != "sandbox\n" {
		t.Errorf("base's hostname became %q", b)
	}

	// Fill past 64 MB: the sandbox's own file system runs out, not the host's.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fill := filepath.Join(r.Dir(), "fill")
	out, err := exec.CommandContext(ctx, "dd", "if=/dev/zero", "of="+fill, "bs=1M", "count=100", "conv=fsync").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "No space left on device") {
		t.Errorf("writing 100 MB into a 64 MB disk: err %v, output %s", err, out)
	}
	if fi, err := os.Stat(fill); err != nil || fi.Size() > 64<<20 || fi.Size() < 50<<20 {
		t.Errorf("fill file: %v %v", fi, err)
	}
	// Directly, too: a write past the limit reports ENOSPC.
	f, err := os.OpenFile(filepath.Join(r.Dir(), "more"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.Write(make([]byte, 4<<20))
		if err == nil {
			err = f.Sync()
		}
		f.Close()
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("write past the limit: %v, want ENOSPC", err)
	}

	unmounted = true
	if err := r.Unmount(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "sb1")
	if err := r.Unmount(); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
}

func TestMountWithoutLimit(t *testing.T) {
	s, layer := tinyStore(t)
	r, err := s.Mount(context.Background(), "sb2", []string{layer}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.UpperDir() != filepath.Join(s.Dir(), "sandboxes/sb2/upper") {
		t.Errorf("upper %s", r.UpperDir())
	}
	if loops := loopsUnder(s.sandboxDir("sb2")); len(loops) > 0 {
		t.Errorf("a loop device without a limit: %v", loops)
	}
	os.WriteFile(filepath.Join(r.Dir(), "new"), []byte("x"), 0o644)
	if _, err := os.Stat(filepath.Join(r.UpperDir(), "new")); err != nil {
		t.Error(err)
	}
	if _, err := s.Mount(context.Background(), "sb2", []string{layer}, 0); err == nil {
		t.Error("second Mount of one sandbox succeeded")
	}
	if err := r.Unmount(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "sb2")
}

// TestMountLayerOrder: layers are given bottom first; an upper layer's
// file hides a lower one's.
func TestMountLayerOrder(t *testing.T) {
	s, bottom := tinyStore(t)
	top := s.LayerDir("l2")
	os.MkdirAll(filepath.Join(top, "etc"), 0o755)
	os.WriteFile(filepath.Join(top, "etc", "from-layer"), []byte("top"), 0o644)
	r, err := s.Mount(context.Background(), "order", []string{bottom, top}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Unmount()
	if b, _ := os.ReadFile(filepath.Join(r.Dir(), "etc", "from-layer")); string(b) != "top" {
		t.Errorf("got %q from the overlay, want the top layer's", b)
	}
}

// TestMountFailureLeavesNothing fails the overlay mount after the disk is
// mounted, and checks bad arguments.
func TestMountFailureLeavesNothing(t *testing.T) {
	s, layer := tinyStore(t)
	ctx := context.Background()
	if _, err := s.Mount(ctx, "sb3", []string{"/nonexistent-layer"}, 32); err == nil {
		t.Fatal("mount over a missing layer succeeded")
	}
	assertGone(t, s, "sb3")
	for _, c := range []struct {
		id     string
		layers []string
		mb     int
	}{{"../x", []string{layer}, 0}, {"ok", nil, 0}, {"ok", []string{"relative"}, 0}, {"ok", []string{layer + ":x"}, 0}, {"ok", []string{layer}, -1}} {
		if _, err := s.Mount(ctx, c.id, c.layers, c.mb); err == nil {
			t.Errorf("Mount(%q, %q, %d) succeeded", c.id, c.layers, c.mb)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(s.Dir(), "sandboxes")); len(entries) > 0 {
		t.Errorf("left in sandboxes/: %v", entries)
	}
}

// TestUnmountBusy: a process still inside the root filesystem (as a dying
// container may be) does not stop Unmount; the loop device goes when it
// leaves.
func TestUnmountBusy(t *testing.T) {
	s, layer := tinyStore(t)
	r, err := s.Mount(context.Background(), "busy", []string{layer}, 16)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sleep", "30")
	cmd.Dir = r.Dir()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := r.Unmount(); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(t, s.sandboxDir("busy")); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	cmd.Process.Kill()
	cmd.Wait()
	assertGone(t, s, "busy")
}

// TestMountConcurrent races loop device allocation and the first format
// of a disk size.
func TestMountConcurrent(t *testing.T) {
	s, layer := tinyStore(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	roots := make([]*Root, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			roots[i], errs[i] = s.Mount(context.Background(), fmt.Sprintf("c%d", i), []string{layer}, 48)
		}()
	}
	wg.Wait()
	devs := map[string]bool{}
	for i := 0; i < n; i++ {
		if errs[i] != nil {
			t.Errorf("mount %d: %v", i, errs[i])
			continue
		}
		for _, l := range loopsUnder(s.sandboxDir(fmt.Sprintf("c%d", i))) {
			dev, _, _ := strings.Cut(l, "=")
			if devs[dev] {
				t.Errorf("loop device %s shared", dev)
			}
			devs[dev] = true
		}
	}
	for i := 0; i < n; i++ {
		if roots[i] != nil {
			if err := roots[i].Unmount(); err != nil {
				t.Error(err)
			}
			assertGone(t, s, fmt.Sprintf("c%d", i))
		}
	}
	if tmps, _ := filepath.Glob(filepath.Join(s.Dir(), "disks", ".tmp-*")); len(tmps) > 0 {
		t.Errorf("temporary disk images left: %v", tmps)
	}
}

func TestCopySparseKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	f.Truncate(64 << 20)
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("middle"), 32<<20)
	f.Close()
	out, err := copySparse(src, filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(out.Name())
	if string(a) != string(b) {
		t.Fatal("copy differs")
	}
	var st syscall.Stat_t
	syscall.Stat(out.Name(), &st)
	if st.Blocks*512 > 1<<20 {
		t.Errorf("copy takes %d bytes: holes were filled", st.Blocks*512)
	}
}

// TestShutdownGuard checks the guard that keeps the shutdown ioctl away
// from anything but a sandbox's own disk. (The ioctl itself is never
// tried on a wrong target here: on the host's root it would stop the host.)
func TestShutdownGuard(t *testing.T) {
	s, layer := tinyStore(t)
	check := func(dir string, want bool) {
		t.Helper()
		fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		if got := isLoopExt4Root(fd, dir); got != want {
			t.Errorf("isLoopExt4Root(%s) = %v, want %v", dir, got, want)
		}
	}
	plain := filepath.Join(s.Dir(), "plain")
	os.Mkdir(plain, 0o755)
	check(plain, false)
	check("/", false)
	r, err := s.Mount(context.Background(), "guard", []string{layer}, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Unmount()
	disk := filepath.Join(s.sandboxDir("guard"), "disk")
	check(disk, true)
	check(filepath.Join(disk, "upper"), false) // inside it, not its root
	check(r.Dir(), false)                      // the overlay
}
