package image

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// defaultDataDir is Warren's own data directory: the base layer built there
// is reused by later test runs and by `warren setup` on the same machine.
const defaultDataDir = "/var/lib/warren"

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, loop devices, chroot")
	}
}

func TestEnsureBase(t *testing.T) {
	needRoot(t)
	s, err := Open(defaultDataDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var log bytes.Buffer
	tmpl, err := s.EnsureBase(ctx, BaseOptions{}, &log)
	if err != nil {
		t.Fatalf("EnsureBase: %v\n%s", err, tail(log.String(), 4000))
	}
	dirs, err := s.LayerDirs(tmpl)
	if err != nil || len(dirs) != 1 {
		t.Fatalf("layers %v %v", dirs, err)
	}
	root := dirs[0]
	for _, bin := range []string{"usr/bin/python3", "usr/bin/node", "usr/bin/npm", "usr/bin/git", "usr/bin/curl", "usr/bin/sudo", "bin/bash", "usr/bin/ps", "usr/bin/ip"} {
		if _, err := os.Stat(filepath.Join(root, bin)); err != nil {
			t.Errorf("base lacks %s: %v", bin, err)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "user:x:1000:1000::/home/user:/bin/bash") {
		t.Errorf("no user uid 1000 in passwd:\n%s", passwd)
	}
	if fi, err := os.Stat(filepath.Join(root, "home/user")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("home of user: %v", err)
	}
	if sudo, _ := os.ReadFile(filepath.Join(root, "etc/sudoers.d/user")); !strings.Contains(string(sudo), "NOPASSWD") {
		t.Error("no passwordless sudo for user")
	}
	if tmpl.User != "user" || tmpl.Workdir != "/home/user" {
		t.Errorf("template defaults %+v", tmpl)
	}
	start := time.Now()
	if _, err := s.EnsureBase(ctx, BaseOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("second EnsureBase took %v; it should find the built base", d)
	}
}

// tinyLayer makes a one-file layer in a temporary store.
func tinyStore(t *testing.T) (*Store, string) {
	t.Helper()
	needRoot(t)
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	layer := s.LayerDir("l1")
	os.MkdirAll(filepath.Join(layer, "etc"), 0o755)
	os.WriteFile(filepath.Join(layer, "etc", "from-layer"), []byte("layer"), 0o644)
	return s, layer
}

func TestMountWritesLandInUpperAndLimitHolds(t *testing.T) {
	s, layer := tinyStore(t)
	r, err := s.Mount(context.Background(), "sb1", []string{layer}, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Unmount(); err != nil {
			t.Error(err)
		}
		assertGone(t, s, "sb1")
	}()
	if b, err := os.ReadFile(filepath.Join(r.Dir(), "etc", "from-layer")); err != nil || string(b) != "layer" {
		t.Fatalf("layer content: %q %v", b, err)
	}
	os.WriteFile(filepath.Join(r.Dir(), "new"), []byte("sandbox"), 0o644)
	if _, err := os.Stat(filepath.Join(r.UpperDir(), "new")); err != nil {
		t.Errorf("write did not land in the upper dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(layer, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Error("write reached the layer")
	}
	// Fill past 64 MB: the sandbox's own file system runs out, not the host's.
	out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(r.Dir(), "fill"), "bs=1M", "count=100").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "No space left on device") {
		t.Errorf("filling 100 MB into a 64 MB disk: err %v, output %s", err, out)
	}
	fi, _ := os.Stat(filepath.Join(r.Dir(), "fill"))
	if fi == nil || fi.Size() > 64<<20 {
		t.Errorf("fill file size %v", fi)
	}
}

func TestMountWithoutLimitAndErrors(t *testing.T) {
	s, layer := tinyStore(t)
	r, err := s.Mount(context.Background(), "sb2", []string{layer}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mount(context.Background(), "sb2", []string{layer}, 0); err == nil {
		t.Error("second Mount of one sandbox succeeded")
	}
	if err := r.Unmount(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "sb2")
	// A failing mount (missing layer) leaves nothing.
	if _, err := s.Mount(context.Background(), "sb3", []string{"/nonexistent-layer"}, 32); err == nil {
		t.Fatal("mount over a missing layer succeeded")
	}
	assertGone(t, s, "sb3")
}

func TestCleanupRemovesUnknownSandboxes(t *testing.T) {
	s, layer := tinyStore(t)
	keep, err := s.Mount(context.Background(), "keep", []string{layer}, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Unmount()
	if _, err := s.Mount(context.Background(), "leftover", []string{layer}, 16); err != nil {
		t.Fatal(err)
	}
	if err := s.Cleanup(func(id string) bool { return id == "keep" }); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "leftover")
	if _, err := os.Stat(filepath.Join(keep.Dir(), "etc", "from-layer")); err != nil {
		t.Errorf("Cleanup touched a known sandbox: %v", err)
	}
}

// assertGone checks that nothing of a sandbox's root filesystem is left:
// no mount, no loop device backed by its image, no directory.
func assertGone(t *testing.T, s *Store, id string) {
	t.Helper()
	dir := s.sandboxDir(id)
	mounts, _ := mountPoints()
	for _, m := range mounts {
		if m == dir || strings.HasPrefix(m, dir+"/") {
			t.Errorf("mount %s left", m)
		}
	}
	// Autoclear detaches the loop device once the file system is gone.
	deadline := time.Now().Add(3 * time.Second)
	for {
		backed := loopsBackedBy(filepath.Join(dir, "disk.img"))
		if len(backed) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("loop devices %v still backed by %s", backed, dir)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s left", dir)
	}
}

func loopsBackedBy(img string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.HasPrefix(strings.TrimSpace(string(b)), img) {
			out = append(out, f)
		}
	}
	return out
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

func BenchmarkMount(b *testing.B) {
	needRoot(b)
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	layer := s.LayerDir("l1")
	os.MkdirAll(layer, 0o755)
	for _, size := range []struct {
		name string
		mb   int
	}{{"nolimit", 0}, {"limit1GiB", 1024}} {
		b.Run(size.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r, err := s.Mount(context.Background(), "bench", []string{layer}, size.mb)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				r.Unmount()
				b.StartTimer()
			}
		})
	}
}
