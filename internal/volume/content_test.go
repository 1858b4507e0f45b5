package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/rootpath"
)

// fixture is a volume tree beside an "outside" directory with a victim
// file that nothing done through the tree may read or change.
type fixture struct {
	tree          *Tree
	dir, outside  string
	victim        string
	victimContent string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	base := t.TempDir()
	f := fixture{dir: filepath.Join(base, "data"), outside: filepath.Join(base, "outside"), victimContent: "host secret\n"}
	f.victim = filepath.Join(f.outside, "victim")
	for _, d := range []string{f.dir, f.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(f.victim, []byte(f.victimContent), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := rootpath.Open(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	f.tree = &Tree{root: root}
	t.Cleanup(func() { f.tree.Close() })
	return f
}

// untouched checks the victim is as it was and alone outside.
func (f fixture) untouched(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(f.victim)
	if err != nil || string(b) != f.victimContent {
		t.Errorf("the victim changed: %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(f.victim, &st); err != nil || st.Uid != 0 || st.Mode&0o7777 != 0o644 {
		t.Errorf("the victim's owner or mode changed: %d %o %v", st.Uid, st.Mode&0o7777, err)
	}
	es, _ := os.ReadDir(f.outside)
	if len(es) != 1 {
		t.Errorf("outside holds %d entries, want the victim alone", len(es))
	}
}

func needRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: content requests set owners")
	}
}

func u32(v uint32) *uint32 { return &v }

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"/": "/", "": "/", "a": "/a", "/a/b/": "/a/b", "a//b": "/a/b", "./a/.": "/a",
	} {
		if got, err := CleanPath(in); err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"..", "/..", "a/../b", "/a/..", "../etc/passwd", "a\x00b", "/" + strings.Repeat("a", 5000)} {
		if _, err := CleanPath(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("CleanPath(%q) accepted", bad)
		}
	}
}

func TestContentOperations(t *testing.T) {
	needRoot(t)
	f := newFixture(t)
	tr := f.tree

	d, err := tr.MakeDir("/docs", Owner{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if d.Type != "directory" || d.UID != DefaultUID || d.GID != DefaultGID || d.Mode != DefaultDirMode || d.Path != "/docs" || d.Name != "docs" {
		t.Errorf("MakeDir with defaults = %+v", d)
	}
	if _, err := tr.MakeDir("/docs", Owner{}, false); !errors.Is(err, ErrConflict) {
		t.Errorf("MakeDir of an existing dir: %v", err)
	}
	if _, err := tr.MakeDir("/docs", Owner{}, true); err != nil {
		t.Errorf("MakeDir with force of an existing dir: %v", err)
	}
	if _, err := tr.MakeDir("/x/y", Owner{}, false); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("MakeDir without parents: %v", err)
	}
	deep, err := tr.MakeDir("/x/y/z", Owner{UID: u32(1000), GID: u32(1001), Mode: u32(0o750)}, true)
	if err != nil || deep.UID != 1000 || deep.GID != 1001 || deep.Mode != 0o750 {
		t.Fatalf("MakeDir with force = %+v %v", deep, err)
	}
	if p, _ := tr.Stat("/x/y"); p.UID != 1000 || p.Mode != DefaultDirMode {
		t.Errorf("a parent made by force = %+v", p)
	}

	e, err := tr.Write("/docs/a.txt", strings.NewReader("hello"), Owner{}, false, nil)
	if err != nil || e.Size != 5 || e.Mode != DefaultFileMode || e.UID != DefaultUID || e.Type != "file" {
		t.Fatalf("Write = %+v %v", e, err)
	}
	if _, err := tr.Write("/docs/a.txt", strings.NewReader("again"), Owner{}, false, nil); !errors.Is(err, ErrConflict) {
		t.Errorf("Write over a file without force: %v", err)
	}
	if e, err := tr.Write("/docs/a.txt", strings.NewReader("replaced"), Owner{Mode: u32(0o600)}, true, nil); err != nil || e.Size != 8 || e.Mode != 0o600 {
		t.Errorf("Write with force = %+v %v", e, err)
	}
	if _, err := tr.Write("/none/a.txt", strings.NewReader("x"), Owner{}, false, nil); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("Write into a missing dir: %v", err)
	}
	if _, err := tr.Write("/made/by/force.txt", strings.NewReader("x"), Owner{}, true, nil); err != nil {
		t.Errorf("Write with force into missing dirs: %v", err)
	}
	if _, err := tr.Write("/docs", strings.NewReader("x"), Owner{}, true, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Write over a directory: %v", err)
	}
	if _, err := tr.Write("/docs/b", strings.NewReader("x"), Owner{Mode: u32(0o4755)}, false, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("a setuid mode was accepted: %v", err)
	}
	file, info, err := tr.Open("/docs/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(file)
	file.Close()
	if string(b) != "replaced" || info.Size != 8 {
		t.Errorf("Open read %q (%+v)", b, info)
	}
	if _, _, err := tr.Open("/docs"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Open of a directory: %v", err)
	}
	if _, _, err := tr.Open("/docs/none"); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("Open of nothing: %v", err)
	}

	upd, err := tr.Update("/docs/a.txt", Owner{UID: u32(1000), Mode: u32(0o640)})
	if err != nil || upd.UID != 1000 || upd.GID != DefaultGID || upd.Mode != 0o640 {
		t.Errorf("Update = %+v %v", upd, err)
	}
	if _, err := tr.Update("/docs/none", Owner{UID: u32(1)}); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("Update of nothing: %v", err)
	}

	list, err := tr.List("/", 1)
	if err != nil {
		t.Fatal(err)
	}
	if names := entryPaths(list); names != "/docs /made /x" {
		t.Errorf("List depth 1 = %s", names)
	}
	list, _ = tr.List("/", 3)
	if names := entryPaths(list); names != "/docs /docs/a.txt /made /made/by /made/by/force.txt /x /x/y /x/y/z" {
		t.Errorf("List depth 3 = %s", names)
	}
	if _, err := tr.List("/", MaxDepth+1); !errors.Is(err, ErrInvalid) {
		t.Errorf("a depth over the maximum: %v", err)
	}
	if _, err := tr.List("/docs/a.txt", 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("List of a file: %v", err)
	}
	if _, err := tr.List("/none", 1); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("List of nothing: %v", err)
	}

	if err := tr.Remove("/x"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Stat("/x/y/z"); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("after Remove: %v", err)
	}
	if err := tr.Remove("/x"); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("second Remove: %v", err)
	}
	if err := tr.Remove("/"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Remove of the root: %v", err)
	}
	// No temporary file is left behind.
	list, _ = tr.List("/docs", 1)
	if names := entryPaths(list); names != "/docs/a.txt" {
		t.Errorf("after writes, /docs holds %s", names)
	}
	f.untouched(t)
}

func entryPaths(es []Entry) string {
	var out []string
	for _, e := range es {
		out = append(out, e.Path)
	}
	return strings.Join(out, " ")
}

// TestContentLinksStayInside plants what a sandbox could put in its
// volume (links to host paths, absolute and relative, links to /proc,
// a hard link to a host file, a device node, a FIFO) and checks that no
// content operation reads or changes anything outside the volume, and
// that none blocks.
func TestContentLinksStayInside(t *testing.T) {
	needRoot(t)
	f := newFixture(t)
	tr := f.tree
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(f.victim, filepath.Join(f.dir, "abs")))
	must(os.Symlink("../outside/victim", filepath.Join(f.dir, "rel")))
	must(os.Symlink(f.outside, filepath.Join(f.dir, "outdir")))
	must(os.Symlink("/proc/self/root"+f.victim, filepath.Join(f.dir, "magic")))
	must(os.Symlink("/proc/self/fd/0", filepath.Join(f.dir, "fd0")))
	must(os.Link(f.victim, filepath.Join(f.dir, "hard")))
	// The hard link shares the victim's content, which must stay.
	must(unix.Mknod(filepath.Join(f.dir, "mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1)))) // /dev/mem
	must(unix.Mkfifo(filepath.Join(f.dir, "fifo"), 0o666))

	for _, p := range []string{"/abs", "/rel", "/outdir/victim", "/magic", "/fd0"} {
		if file, _, err := tr.Open(p); err == nil {
			b, _ := io.ReadAll(file)
			file.Close()
			t.Errorf("Open(%q) read %q", p, b)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range []string{"/mem", "/fifo"} {
			if file, _, err := tr.Open(p); err == nil || !errors.Is(err, ErrInvalid) {
				if file != nil {
					file.Close()
				}
				t.Errorf("Open(%q) of a special file: %v", p, err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("opening a FIFO or device blocked")
	}

	// Writes through links write inside the volume or replace the link.
	for _, p := range []string{"/abs", "/rel", "/hard", "/mem", "/fifo"} {
		if _, err := tr.Write(p, strings.NewReader("pwned"), Owner{}, true, nil); err != nil {
			t.Errorf("Write with force over %s: %v", p, err)
		}
		if file, _, err := tr.Open(p); err != nil {
			t.Errorf("reading back %s: %v", p, err)
		} else {
			b, _ := io.ReadAll(file)
			file.Close()
			if string(b) != "pwned" {
				t.Errorf("%s reads %q after the write", p, b)
			}
		}
	}
	// A link to a host directory leads to the volume's own copy of that
	// path, which does not exist: these fail (or would land inside).
	if _, err := tr.Write("/outdir/new", strings.NewReader("x"), Owner{}, true, nil); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("Write through a link to an outside directory: %v", err)
	}
	if _, err := tr.MakeDir("/outdir/sub", Owner{}, true); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("MakeDir through a link: %v", err)
	}
	// Metadata changes through links land inside too.
	must(os.Symlink(f.victim, filepath.Join(f.dir, "abs2")))
	if _, err := tr.Update("/abs2", Owner{UID: u32(1234), Mode: u32(0o777)}); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("Update through a link to the host: %v", err)
	}
	// Listing shows links without following them.
	if list, err := tr.List("/", 3); err != nil {
		t.Error(err)
	} else {
		for _, e := range list {
			if strings.HasPrefix(e.Path, "/outdir/") {
				t.Errorf("List followed a link into %s", e.Path)
			}
			if e.Path == "/abs2" && (e.Target == nil || *e.Target != f.victim || e.Type != "unknown") {
				t.Errorf("a dangling (inside) link is listed as %+v", e)
			}
		}
	}
	if e, err := tr.Stat("/outdir"); err != nil || e.Target == nil || *e.Target != f.outside || e.Type != "unknown" {
		t.Errorf("Stat of a link leading nowhere inside = %+v %v", e, err)
	}
	must(os.Symlink("docs", filepath.Join(f.dir, "tolocal")))
	must(os.Mkdir(filepath.Join(f.dir, "docs"), 0o755))
	if e, err := tr.Stat("/tolocal"); err != nil || e.Target == nil || e.Type != "directory" || e.Mode != 0o755 {
		t.Errorf("Stat of a link to a directory inside = %+v %v", e, err)
	}
	// Removing a directory holding links removes the links only.
	must(os.Mkdir(filepath.Join(f.dir, "d"), 0o755))
	must(os.Symlink(f.outside, filepath.Join(f.dir, "d", "out")))
	if err := tr.Remove("/d"); err != nil {
		t.Error(err)
	}
	if err := tr.Remove("/outdir"); err != nil {
		t.Error(err)
	}
	f.untouched(t)
}

func TestWriteStopsAtTheGuard(t *testing.T) {
	needRoot(t)
	f := newFixture(t)
	full := errors.Join(ErrNoSpace, errors.New("the node's disk is below its reserve"))
	calls := 0
	_, err := f.tree.Write("/big", io.LimitReader(zeros{}, 200<<20), Owner{}, false, func(int64) error {
		calls++
		if calls == 2 {
			return full
		}
		return nil
	})
	if !errors.Is(err, ErrNoSpace) || calls != 2 {
		t.Errorf("Write past the guard: %v after %d calls", err, calls)
	}
	if list, _ := f.tree.List("/", 1); len(list) != 0 {
		t.Errorf("a stopped write left %s", entryPaths(list))
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "", "a/b", "../x", "/a/../../b", "a\x00", "//..//", "/.../x", "./.", strings.Repeat("/a", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := CleanPath(p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/") || strings.Contains(got, "..") && containsDotDot(got) || strings.ContainsRune(got, 0) {
			t.Errorf("CleanPath(%q) = %q", p, got)
		}
		if filepath.Clean(got) != got {
			t.Errorf("CleanPath(%q) = %q, not clean", p, got)
		}
		if again, err := CleanPath(got); err != nil || again != got {
			t.Errorf("CleanPath is not idempotent on %q: %q %v", got, again, err)
		}
		if bytes.Contains([]byte(p), []byte{0}) {
			t.Errorf("CleanPath(%q) accepted a NUL", p)
		}
	})
}

func containsDotDot(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return true
		}
	}
	return false
}

// A listing stops at MaxListEntries with a clear error, whatever depth
// brings them in.
func TestListIsBounded(t *testing.T) {
	f := newFixture(t)
	for i := 0; i < 101; i++ {
		d := filepath.Join(f.dir, fmt.Sprintf("d%03d", i))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 99; j++ {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%02d", j)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if list, err := f.tree.List("/", 1); err != nil || len(list) != 101 {
		t.Errorf("depth 1: %d entries, %v", len(list), err)
	}
	// 101 directories + 101 × 99 files = 10100 entries at depth 2.
	if _, err := f.tree.List("/", 2); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "10000") {
		t.Errorf("10100 entries: %v", err)
	}
}
