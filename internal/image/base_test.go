package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestEnsureBase builds the base in Warren's real data directory (once per
// machine and recipe: 1–3 minutes), then checks its contents from a
// sandbox-like overlay over it.
func TestEnsureBase(t *testing.T) {
	needRoot(t)
	s, err := Open(defaultDataDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tmpl, err := s.EnsureBase(ctx, BaseOptions{}, tlog{t})
	if err != nil {
		t.Fatalf("EnsureBase: %v", err)
	}
	if tmpl.User != "user" || tmpl.Workdir != "/home/user" || tmpl.Recipe != baseRecipe || len(tmpl.Layers) != 1 {
		t.Errorf("template %+v", tmpl)
	}
	dirs, err := s.LayerDirs(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	root := dirs[0]

	start := time.Now()
	again, err := s.EnsureBase(ctx, BaseOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("second EnsureBase took %v; it should find the built base", d)
	}
	if again.Layers[0] != tmpl.Layers[0] {
		t.Errorf("second EnsureBase gave layer %s, first %s", again.Layers[0], tmpl.Layers[0])
	}

	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "\nuser:x:1000:1000::/home/user:/bin/bash\n") {
		t.Errorf("no user uid 1000 in passwd:\n%s", passwd)
	}
	if fi, err := os.Stat(filepath.Join(root, "home/user")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 || fi.Sys().(*syscall.Stat_t).Gid != 1000 {
		t.Errorf("home of user: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/sudoers.d/user")); err != nil || fi.Mode().Perm() != 0o440 {
		t.Errorf("sudoers.d/user: %v %v", fi, err)
	}
	if lists, _ := filepath.Glob(filepath.Join(root, "var/lib/apt/lists/*_Packages")); len(lists) > 0 {
		t.Errorf("apt lists left: %v", lists)
	}
	if debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb")); len(debs) > 0 {
		t.Errorf("apt archives left: %d", len(debs))
	}
	for _, f := range []string{"usr/sbin/policy-rc.d"} {
		if _, err := os.Lstat(filepath.Join(root, f)); err == nil {
			t.Errorf("build leftover %s", f)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/resolv.conf")); len(b) != 0 {
		t.Errorf("the host's resolv.conf stayed in the base: %q", b)
	}
	if m := mountsUnder(t, root); len(m) > 0 {
		t.Errorf("mounts left in the base: %v", m)
	}

	// Run the tools in an overlay over the base (running them in the layer
	// itself could write to it, e.g. Python's bytecode caches).
	ts, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r, err := ts.Mount(ctx, "tools", dirs, 256)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Unmount(); err != nil {
			t.Error(err)
		}
	}()
	script := `set -e
python3 -c 'import sys; print("python", sys.version_info[0])'
node -e 'console.log("node", process.version)'
npm --version
git --version
curl --version | head -1
bash --version | head -1
command -v ps pgrep >/dev/null # procps; running ps needs /proc
ip -V
sudo -n -u user sh -c 'echo "user $(id -u):$(id -g) $HOME"'
su user -c 'sudo -n id -u'
`
	cctx, ccancel := context.WithTimeout(ctx, time.Minute)
	defer ccancel()
	cmd := exec.CommandContext(cctx, "chroot", r.Dir(), "/bin/bash", "-c", script)
	cmd.Env = []string{"PATH=" + chrootPath, "HOME=/root", "LC_ALL=C"}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("in the base:\n%s", out)
	if err != nil {
		t.Fatalf("tools in the base: %v", err)
	}
	for _, want := range []string{"python 3", "node v18", "git version", "curl ", "GNU bash", "user 1000:1000 /home/user", "\n0\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// fakeRecipe is a template whose layer build is counted and controllable.
type fakeRecipe struct {
	builds atomic.Int32
	fail   error
	delay  time.Duration
}

func (f *fakeRecipe) build(ctx context.Context, dir string, step stepFunc, _ io.Writer) error {
	f.builds.Add(1)
	step("fake build")
	if err := os.WriteFile(filepath.Join(dir, "half"), []byte("x"), 0o644); err != nil {
		return err
	}
	select {
	case <-time.After(f.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	if f.fail != nil {
		return f.fail
	}
	return os.WriteFile(filepath.Join(dir, "done"), []byte("x"), 0o644)
}

func TestEnsureTemplateBuildsOnceForConcurrentCallers(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRecipe{delay: 300 * time.Millisecond}
	want := Template{ID: "fake", Recipe: "r1", User: "user"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	results := make([]*Template, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = s.ensureTemplate(ctx, want, f.build, nil)
		}()
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil || results[i] == nil || results[i].Layers[0] != "fake-r1" {
			t.Fatalf("caller %d: %+v %v", i, results[i], errs[i])
		}
	}
	if n := f.builds.Load(); n != 1 {
		t.Errorf("%d builds for 4 concurrent callers", n)
	}
	if _, err := os.Stat(filepath.Join(s.LayerDir("fake-r1"), "done")); err != nil {
		t.Error(err)
	}
	// A new recipe builds a new layer beside the old one.
	if _, err := s.ensureTemplate(ctx, Template{ID: "fake", Recipe: "r2"}, f.build, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Template("fake"); got == nil || got.Layers[0] != "fake-r2" || f.builds.Load() != 2 {
		t.Errorf("after a recipe change: %+v, %d builds", got, f.builds.Load())
	}
	if _, err := os.Stat(s.LayerDir("fake-r1")); err != nil {
		t.Errorf("old layer removed: %v", err)
	}
}

func TestEnsureTemplateInterruptedNeverLooksComplete(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want := Template{ID: "fake", Recipe: "r1"}
	ctx := context.Background()

	// A failing build leaves no layer, no template, no build directory.
	boom := errors.New("boom")
	if _, err := s.ensureTemplate(ctx, want, (&fakeRecipe{fail: boom}).build, nil); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	// So does a cancelled one.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.ensureTemplate(cctx, want, (&fakeRecipe{delay: time.Minute}).build, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(s.Dir(), "layers"))
	if len(entries) != 0 {
		t.Errorf("layers/ after failed builds: %v", entries)
	}
	if _, err := s.Template("fake"); !errors.Is(err, ErrNotFound) {
		t.Errorf("template after failed builds: %v", err)
	}

	// A crash mid-build (the process died: its build dir stays) is
	// replaced by the next build.
	crashed := filepath.Join(s.Dir(), "layers", ".build-fake")
	os.MkdirAll(crashed, 0o755)
	os.WriteFile(filepath.Join(crashed, "half"), nil, 0o644)
	f := &fakeRecipe{}
	tmpl, err := s.ensureTemplate(ctx, want, f.build, nil)
	if err != nil || f.builds.Load() != 1 {
		t.Fatalf("after a crash: %+v %v, %d builds", tmpl, err, f.builds.Load())
	}
	if _, err := os.Stat(crashed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("crashed build dir left: %v", err)
	}

	// A crash after the rename, before the template: the layer is whole
	// and only the template is written.
	os.Remove(filepath.Join(s.Dir(), "templates", "fake.json"))
	if _, err := s.ensureTemplate(ctx, want, f.build, nil); err != nil || f.builds.Load() != 1 {
		t.Fatalf("template rewrite: %v, %d builds", err, f.builds.Load())
	}
	if got, err := s.Template("fake"); err != nil || got.Layers[0] != "fake-r1" {
		t.Errorf("template %+v %v", got, err)
	}
}

func TestBuildProgressLines(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := s.ensureTemplate(context.Background(), Template{ID: "fake", Recipe: "r1"}, (&fakeRecipe{}).build, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[fake", "s] building layer fake-r1", "s] fake build", "s] template fake ready"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, out.String())
		}
	}
}
