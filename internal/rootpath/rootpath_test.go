package rootpath

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// tree is a root beside an "outside" directory holding a victim file,
// which nothing done through the root may change.
type tree struct {
	root, outside, victim string
}

func newTree(t *testing.T) tree {
	t.Helper()
	base := t.TempDir()
	tr := tree{root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	tr.victim = filepath.Join(tr.outside, "victim")
	for _, d := range []string{tr.root, tr.outside, filepath.Join(tr.root, "etc")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(tr.victim, []byte("victim\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return tr
}

// untouched checks the outside directory holds only the unchanged victim.
func (tr tree) untouched(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(tr.victim)
	if err != nil || string(b) != "victim\n" {
		t.Errorf("victim changed: %q %v", b, err)
	}
	es, _ := os.ReadDir(tr.outside)
	if len(es) != 1 {
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		t.Errorf("outside holds %v, want only victim", names)
	}
	var st unix.Stat_t
	if err := unix.Lstat(tr.victim, &st); err != nil || st.Nlink != 1 && st.Nlink != 2 {
		t.Errorf("victim: nlink %d %v", st.Nlink, err)
	}
}

func (tr tree) open(t *testing.T) *Root {
	t.Helper()
	r, err := Open(tr.root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// regular checks that p (a host path) is a regular file holding want.
func regular(t *testing.T, p, want string) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	if !fi.Mode().IsRegular() {
		t.Errorf("%s is %v, want a regular file", p, fi.Mode())
	}
	if b, _ := os.ReadFile(p); string(b) != want {
		t.Errorf("%s holds %q, want %q", p, b, want)
	}
}

func TestWriteFileNeverLeavesTheRoot(t *testing.T) {
	cases := map[string]struct {
		plant func(tr tree) error
		// lands is where the file ends up, relative to the root
		lands func(tr tree) string
	}{
		"absolute symlink": {func(tr tree) error { return os.Symlink(tr.victim, filepath.Join(tr.root, "etc/hosts")) }, fixed("etc/hosts")},
		"relative symlink out": {func(tr tree) error {
			return os.Symlink("../../outside/victim", filepath.Join(tr.root, "etc/hosts"))
		}, fixed("etc/hosts")},
		"hard link":        {func(tr tree) error { return os.Link(tr.victim, filepath.Join(tr.root, "etc/hosts")) }, fixed("etc/hosts")},
		"dangling symlink": {func(tr tree) error { return os.Symlink("/nonexistent", filepath.Join(tr.root, "etc/hosts")) }, fixed("etc/hosts")},
		"symlinked dir, absolute": {func(tr tree) error {
			if err := os.Remove(filepath.Join(tr.root, "etc")); err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Join(tr.root, tr.outside), 0o755); err != nil {
				return err
			}
			return os.Symlink(tr.outside, filepath.Join(tr.root, "etc"))
		}, func(tr tree) string { return filepath.Join(tr.outside, "hosts") }},
		"symlinked dir, dangling": {func(tr tree) error {
			if err := os.Remove(filepath.Join(tr.root, "etc")); err != nil {
				return err
			}
			return os.Symlink(tr.outside, filepath.Join(tr.root, "etc"))
		}, func(tr tree) string { return filepath.Join(tr.outside, "hosts") }},
		"symlinked dir, climbing": {func(tr tree) error {
			if err := os.Remove(filepath.Join(tr.root, "etc")); err != nil {
				return err
			}
			return os.Symlink("../../../../../../outside", filepath.Join(tr.root, "etc"))
		}, fixed("outside/hosts")},
		"magic link": {func(tr tree) error {
			if err := os.Remove(filepath.Join(tr.root, "etc")); err != nil {
				return err
			}
			return os.Symlink("/proc/self/cwd", filepath.Join(tr.root, "etc"))
		}, fixed("proc/self/cwd/hosts")},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			tr := newTree(t)
			if err := c.plant(tr); err != nil {
				t.Fatal(err)
			}
			r := tr.open(t)
			if err := r.WriteFile("/etc/hosts", []byte("mine\n"), 0o644); err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			tr.untouched(t)
			regular(t, filepath.Join(tr.root, c.lands(tr)), "mine\n")
			if fi, _ := os.Lstat(filepath.Join(tr.root, c.lands(tr))); fi != nil && fi.Mode().Perm() != 0o644 {
				t.Errorf("mode %v, want 0644", fi.Mode())
			}
			if tmps, _ := filepath.Glob(filepath.Join(tr.root, "*", ".warren-*")); len(tmps) > 0 {
				t.Errorf("temporary files left: %v", tmps)
			}
		})
	}
}

func fixed(rel string) func(tree) string { return func(tree) string { return rel } }

func TestWriteFileRefusesADirectory(t *testing.T) {
	tr := newTree(t)
	if err := os.Mkdir(filepath.Join(tr.root, "etc/hosts"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := tr.open(t).WriteFile("etc/hosts", []byte("x"), 0o644); err == nil {
		t.Fatal("WriteFile over a directory succeeded")
	}
	if tmps, _ := filepath.Glob(filepath.Join(tr.root, "etc", ".warren-*")); len(tmps) > 0 {
		t.Errorf("temporary files left: %v", tmps)
	}
	if err := tr.open(t).WriteFile("/", []byte("x"), 0o644); err == nil {
		t.Error("WriteFile of the root succeeded")
	}
}

func TestMkdirAllLoops(t *testing.T) {
	tr := newTree(t)
	if err := os.Symlink("b", filepath.Join(tr.root, "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", filepath.Join(tr.root, "b")); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.open(t).MkdirAll("a/x", 0o755); err == nil {
		t.Fatal("MkdirAll through a link loop succeeded")
	}
	tr.untouched(t)
}

func TestEnsureFile(t *testing.T) {
	tr := newTree(t)
	r := tr.open(t)
	if err := os.WriteFile(filepath.Join(tr.root, "etc/kept"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tr.victim, filepath.Join(tr.root, "etc/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../outside/victim", filepath.Join(tr.root, "opt")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"/etc/kept", "/etc/link", "/etc/new", "/opt/warren/envd"} {
		if err := r.EnsureFile(n, 0o644); err != nil {
			t.Errorf("EnsureFile %s: %v", n, err)
		}
	}
	regular(t, filepath.Join(tr.root, "etc/kept"), "kept")
	regular(t, filepath.Join(tr.root, "etc/link"), "")
	regular(t, filepath.Join(tr.root, "etc/new"), "")
	regular(t, filepath.Join(tr.root, "outside/victim/warren/envd"), "")
	if err := r.EnsureFile("/etc", 0o644); err == nil {
		t.Error("EnsureFile of a directory succeeded")
	}
	tr.untouched(t)
}

func TestOpenFileResolvesInRoot(t *testing.T) {
	tr := newTree(t)
	if err := os.WriteFile(filepath.Join(tr.root, "etc/passwd"), []byte("root's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("/", "etc", "passwd"), filepath.Join(tr.root, "etc/hosts")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../outside/victim", filepath.Join(tr.root, "up")); err != nil {
		t.Fatal(err)
	}
	r := tr.open(t)
	f, err := r.OpenFile("etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "root's" {
		t.Errorf("read %q through the link, want the root's own /etc/passwd", b)
	}
	if _, err := r.OpenFile("up"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("a link climbing out: %v, want ENOENT inside the root", err)
	}
	st, err := r.Lstat("etc/hosts")
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		t.Errorf("Lstat: mode %o %v, want the link itself", st.Mode, err)
	}
}

// BenchmarkNodeFiles times what the node does per sandbox: /etc/hosts
// written and two mount points checked, through a new Root.
func BenchmarkNodeFiles(b *testing.B) {
	root := b.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		r, err := Open(root)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.WriteFile("/etc/hosts", []byte("127.0.0.1\tlocalhost\n"), 0o644); err != nil {
			b.Fatal(err)
		}
		for _, m := range []string{"/opt/warren/envd", "/etc/resolv.conf"} {
			if err := r.EnsureFile(m, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		r.Close()
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(dir+"/f", []byte("data"), 0o644))
	must(os.Symlink("/etc/passwd", dir+"/abs"))
	must(unix.Mkfifo(dir+"/fifo", 0o644))
	r, err := Open(dir)
	must(err)
	defer r.Close()
	if b, err := r.ReadFile("/f", 10); err != nil || string(b) != "data" {
		t.Errorf("a file: %q, %v", b, err)
	}
	if _, err := r.ReadFile("/f", 3); err == nil {
		t.Error("a file over the limit was read")
	}
	// An absolute link resolves inside the root, where there is no /etc/passwd.
	if b, err := r.ReadFile("/abs", 1<<20); err == nil {
		t.Errorf("a link out of the root was followed: %q", b)
	}
	if _, err := r.ReadFile("/fifo", 10); err == nil {
		t.Error("a FIFO was read")
	}
}

func TestOpenAndParentStayInside(t *testing.T) {
	tr := newTree(t)
	r := tr.open(t)
	if err := os.Symlink(tr.outside, filepath.Join(tr.root, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../outside/victim", filepath.Join(tr.root, "etc", "rel")); err != nil {
		t.Fatal(err)
	}
	// A link's target, absolute or relative, is resolved inside the root.
	for _, name := range []string{"/out/victim", "etc/rel", "../../outside/victim"} {
		if f, err := r.Open(name, unix.O_RDONLY, 0); err == nil {
			f.Close()
			t.Errorf("Open(%q) reached a file", name)
		}
	}
	// The link leads to the root's own (missing) copy of the outside
	// path: nothing is created, outside or in.
	if f, err := r.Open("/out/new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600); !errors.Is(err, unix.ENOENT) {
		if f != nil {
			f.Close()
		}
		t.Errorf("creating through a link to the outside: %v", err)
	}
	f, err := r.Open("/etc/new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	dir, base, err := r.Parent("/etc/rel")
	if err != nil || base != "rel" {
		t.Fatalf("Parent = %q %v", base, err)
	}
	defer dir.Close()
	if err := unix.Unlinkat(int(dir.Fd()), base, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Parent("/"); err == nil {
		t.Error("the root has a parent")
	}
	tr.untouched(t)
}

func TestMkdirAllNoLinks(t *testing.T) {
	tr := newTree(t)
	r := tr.open(t)
	if err := r.MkdirAllNoLinks("/data/a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(tr.root, "data", "a", "b")); err != nil || !fi.IsDir() {
		t.Errorf("not made: %v", err)
	}
	if err := r.MkdirAllNoLinks("/data/a", 0o755); err != nil {
		t.Errorf("an existing directory: %v", err)
	}
	os.Symlink(tr.outside, filepath.Join(tr.root, "link"))
	os.Symlink("/etc", filepath.Join(tr.root, "etc", "inner"))
	os.WriteFile(filepath.Join(tr.root, "file"), nil, 0o644)
	for _, name := range []string{"/link", "/link/x", "/etc/inner/x", "/file", "/file/x"} {
		if err := r.MkdirAllNoLinks(name, 0o755); err == nil {
			t.Errorf("MkdirAllNoLinks(%q) went through a link or a file", name)
		}
	}
	tr.untouched(t)
}
