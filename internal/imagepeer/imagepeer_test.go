package imagepeer

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// builtLayer makes layer id in s as a build's commit leaves one: files
// with owners and modes, a setuid program, a hard link, a symbolic link
// out of the layer, a FIFO, a whiteout and an opaque directory.
func builtLayer(t *testing.T, s *image.Store, id string) {
	t.Helper()
	d := s.LayerDir(id)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(d, "etc/app"), 0o755))
	must(os.WriteFile(filepath.Join(d, "etc/app/conf"), []byte("key=value\n"), 0o640))
	must(os.Chown(filepath.Join(d, "etc/app/conf"), 1000, 1001))
	must(os.MkdirAll(filepath.Join(d, "usr/bin"), 0o755))
	must(os.WriteFile(filepath.Join(d, "usr/bin/tool"), []byte("#!/bin/sh\n"), 0o755))
	must(unix.Chmod(filepath.Join(d, "usr/bin/tool"), 0o4755))
	must(os.Link(filepath.Join(d, "usr/bin/tool"), filepath.Join(d, "usr/bin/tool2")))
	must(os.Symlink("/etc/passwd", filepath.Join(d, "etc/passwd-link")))
	must(unix.Mkfifo(filepath.Join(d, "etc/fifo"), 0o600))
	must(unix.Mknod(filepath.Join(d, "etc/deleted"), unix.S_IFCHR|0o600, 0)) // a whiteout
	must(os.MkdirAll(filepath.Join(d, "var/cache"), 0o700))
	must(unix.Lsetxattr(filepath.Join(d, "var/cache"), "trusted.overlay.opaque", []byte("y"), 0))
}

func TestPullMovesAnImage(t *testing.T) {
	testenv.NeedRoot(t)
	from, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	to, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	builtLayer(t, from, "l1")
	if err := from.PutTemplate(&image.Template{ID: "b1", Layers: []string{"l1"}, User: "user", Workdir: "/home/user"}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(from))
	defer srv.Close()
	p := pullerFrom(srv, to)
	if err := p.Pull(context.Background(), "builder", "b1"); err != nil {
		t.Fatal(err)
	}
	got, err := to.Template("b1")
	if err != nil || got.User != "user" || len(got.Layers) != 1 {
		t.Fatalf("record %+v %v", got, err)
	}
	d := to.LayerDir("l1")
	var st unix.Stat_t
	check := func(rel string, want func(unix.Stat_t) bool, what string) {
		t.Helper()
		if err := unix.Lstat(filepath.Join(d, rel), &st); err != nil || !want(st) {
			t.Errorf("%s: %s (%+v, %v)", rel, what, st, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(d, "etc/app/conf")); string(b) != "key=value\n" {
		t.Errorf("conf holds %q", b)
	}
	check("etc/app/conf", func(s unix.Stat_t) bool { return s.Uid == 1000 && s.Gid == 1001 && s.Mode&0o7777 == 0o640 }, "owner and mode kept")
	check("usr/bin/tool", func(s unix.Stat_t) bool { return s.Mode&0o7777 == 0o4755 && s.Nlink == 2 }, "setuid kept, hard-linked")
	check("etc/passwd-link", func(s unix.Stat_t) bool { return s.Mode&unix.S_IFMT == unix.S_IFLNK }, "still a link")
	check("etc/fifo", func(s unix.Stat_t) bool { return s.Mode&unix.S_IFMT == unix.S_IFIFO }, "a FIFO")
	check("etc/deleted", func(s unix.Stat_t) bool { return s.Mode&unix.S_IFMT == unix.S_IFCHR && s.Rdev == 0 }, "a whiteout")
	if v, err := getxattr(filepath.Join(d, "var/cache"), "trusted.overlay.opaque"); err != nil || v != "y" {
		t.Errorf("var/cache is not opaque: %q %v", v, err)
	}
	if l, _ := os.Readlink(filepath.Join(d, "etc/passwd-link")); l != "/etc/passwd" {
		t.Errorf("link to %q", l)
	}
	// Pulled once: a second pull asks nothing.
	srv.Close()
	if err := p.Pull(context.Background(), "builder", "b1"); err != nil {
		t.Errorf("a second pull: %v", err)
	}
}

// A stream whose digest does not match leaves nothing behind.
func TestPullRefusesADamagedLayer(t *testing.T) {
	testenv.NeedRoot(t)
	from, _ := image.Open(t.TempDir())
	to, _ := image.Open(t.TempDir())
	builtLayer(t, from, "l1")
	from.PutTemplate(&image.Template{ID: "b1", Layers: []string{"l1"}})
	h := Handler(from)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(contentSpoiler{w}, r)
	}))
	defer srv.Close()
	p := pullerFrom(srv, to)
	if err := p.Pull(context.Background(), "builder", "b1"); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("a damaged layer: %v", err)
	}
	if to.HasLayer("l1") {
		t.Error("the damaged layer was kept")
	}
	if _, err := to.Template("b1"); err == nil {
		t.Error("the record was written")
	}
	left, _ := filepath.Glob(filepath.Join(to.Dir(), "layers", image.PullTempPrefix+"*"))
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// A checkpoint travels with its image: what its files hold, holes kept.
func TestPullMovesACheckpoint(t *testing.T) {
	testenv.NeedRoot(t)
	from, _ := image.Open(t.TempDir())
	to, _ := image.Open(t.TempDir())
	builtLayer(t, from, "l1")
	sd := from.SnapshotDir("s1")
	if err := os.MkdirAll(sd, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(sd, "checkpoint.img"), []byte("kernel state"), 0o600)
	disk, err := os.Create(filepath.Join(sd, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	disk.Truncate(2 << 30) // 2 GiB apparent, a few bytes held
	disk.WriteAt([]byte("superblock"), 1024)
	disk.WriteAt([]byte("a file"), 1<<30)
	disk.Close()
	from.PutTemplate(&image.Template{ID: "b2", Layers: []string{"l1"}, Snapshot: "s1", SnapshotDisk: true})
	srv := httptest.NewServer(Handler(from))
	defer srv.Close()
	p := pullerFrom(srv, to)
	if err := p.Pull(context.Background(), "builder", "b2"); err != nil {
		t.Fatal(err)
	}
	got := to.SnapshotDir("s1")
	if b, _ := os.ReadFile(filepath.Join(got, "checkpoint.img")); string(b) != "kernel state" {
		t.Errorf("checkpoint.img holds %q", b)
	}
	f, err := os.Open(filepath.Join(got, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 10)
	f.ReadAt(buf, 1024)
	tail := make([]byte, 6)
	f.ReadAt(tail, 1<<30)
	var st unix.Stat_t
	unix.Fstat(int(f.Fd()), &st)
	if string(buf) != "superblock" || string(tail) != "a file" || st.Size != 2<<30 {
		t.Errorf("disk.img: %q %q, %d bytes", buf, tail, st.Size)
	}
	if st.Blocks*512 > 1<<20 {
		t.Errorf("disk.img takes %d bytes: its holes were filled", st.Blocks*512)
	}
}

// contentSpoiler changes a file's content on the way (not a header's:
// the tar still parses).
type contentSpoiler struct{ http.ResponseWriter }

func (s contentSpoiler) Write(b []byte) (int, error) {
	return s.ResponseWriter.Write(bytes.ReplaceAll(b, []byte("key=value"), []byte("kez=value")))
}

func (s contentSpoiler) Flush() { s.ResponseWriter.(http.Flusher).Flush() }

func TestHandlerRefusesBadIDs(t *testing.T) {
	s, _ := image.Open(t.TempDir())
	srv := httptest.NewServer(Handler(s))
	defer srv.Close()
	for path, want := range map[string]int{
		"/images/layers/..":        400,
		"/images/layers/nosuch":    404,
		"/images/templates/nosuch": 404,
		"/images/templates/a%2Fb":  400,
		"/images/other/x":          404,
	} {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, res.StatusCode, want)
		}
	}
}

// A checkpoint stream names files only inside its dir, and writes only
// within each file's size.
func TestReadSnapshotRefusesABadStream(t *testing.T) {
	for name, stream := range map[string]string{
		"a path":             "file ../escape 3 600\ndata 0 3\nabcend\ndone\n",
		"a sub dir":          "file a/b 3 600\nend\ndone\n",
		"dot dot":            "file .. 3 600\nend\ndone\n",
		"past its size":      "file f 3 600\ndata 2 5\nabcdeend\ndone\n",
		"a negative offset":  "file f 3 600\ndata -1 1\naend\ndone\n",
		"cut short":          "file f 10 600\ndata 0 10\nabc",
		"no done":            "file f 0 600\nend\n",
		"an unknown line":    "rm -rf /\n",
		"a file named twice": "file f 0 600\nend\nfile f 0 600\nend\ndone\n",
	} {
		dir := t.TempDir()
		parent := filepath.Dir(dir)
		before, _ := os.ReadDir(parent)
		if err := readSnapshot(strings.NewReader(stream), dir); err == nil {
			t.Errorf("%s: taken", name)
		}
		if after, _ := os.ReadDir(parent); len(after) != len(before) {
			t.Errorf("%s: wrote beside the dir", name)
		}
	}
	var many strings.Builder
	for i := range maxSnapshotFiles + 1 {
		fmt.Fprintf(&many, "file f%d 0 600\nend\n", i)
	}
	many.WriteString("done\n")
	if err := readSnapshot(strings.NewReader(many.String()), t.TempDir()); err == nil {
		t.Error("too many files: taken")
	}
}

// pullerFrom pulls into to from the node srv is.
func pullerFrom(srv *httptest.Server, to *image.Store) *Puller {
	return &Puller{Images: to, Transport: http.DefaultTransport,
		Addr: func(context.Context, string) (string, error) { return strings.TrimPrefix(srv.URL, "http://"), nil }}
}
