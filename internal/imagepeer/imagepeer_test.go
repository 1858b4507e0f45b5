package imagepeer

import (
	"bytes"
	"context"
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
	p := &Puller{Images: to, Transport: http.DefaultTransport,
		Addr: func(context.Context, string) (string, error) { return strings.TrimPrefix(srv.URL, "http://"), nil }}
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
	p := &Puller{Images: to, Transport: http.DefaultTransport,
		Addr: func(context.Context, string) (string, error) { return strings.TrimPrefix(srv.URL, "http://"), nil }}
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
	// An image that starts from a checkpoint does not move.
	from.PutTemplate(&image.Template{ID: "b2", Layers: []string{"l1"}, Snapshot: "s1"})
	if err := p.Pull(context.Background(), "builder", "b2"); err == nil || !strings.Contains(err.Error(), "checkpoint") {
		t.Errorf("an image with a checkpoint: %v", err)
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
