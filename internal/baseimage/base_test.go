package baseimage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// defaultDataDir is Warren's own data directory: the base layer built there
// is reused by later test runs and by `warren setup` on the same machine.
// Tests only build the base there; their sandboxes live in temporary
// stores, out of reach of a concurrent Cleanup of the real one.
const defaultDataDir = "/var/lib/warren"

// TestEnsureBase builds the base in Warren's real data directory (once per
// machine and recipe: 1–3 minutes), then checks its contents from a
// sandbox-like overlay over it.
func TestEnsureBase(t *testing.T) {
	testenv.NeedRoot(t)
	s, err := image.Open(defaultDataDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tmpl, err := Ensure(ctx, s, Options{}, testenv.Log(t))
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
	again, err := Ensure(ctx, s, Options{}, nil)
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
	if m, err := mountinfo.Below(root); err != nil || len(m) > 0 {
		t.Errorf("mounts left in the base: %v", m)
	}

	// Run the tools in an overlay over the base (running them in the layer
	// itself could write to it, e.g. Python's bytecode caches).
	ts, err := rootfs.Open(t.TempDir())
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
python -c 'import sys; print("plain python", sys.version_info[0])' # E2B's base has both
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
	for _, want := range []string{"python 3", "plain python 3", "node v18", "git version", "curl ", "GNU bash", "user 1000:1000 /home/user", "\n0\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
