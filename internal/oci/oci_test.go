package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/testenv"
	"golang.org/x/sys/unix"
)

// Names in a layer's on-disk form (literal here: the tests check that
// form, not the package's constants).
const (
	opaqueXattr      = "trusted.overlay.opaque"
	whiteoutOpaque   = ".wh..wh..opq"
	capabilityXattr  = "security.capability"
	capabilityPAXKey = "SCHILY.xattr." + capabilityXattr
)

// tarEntry is one entry of a test layer; Typeflag 0 is a regular file
// holding body.
type tarEntry struct {
	tar.Header
	body string
}

var testMtime = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

func tfile(n, body string, mode int64) tarEntry {
	return tarEntry{Header: tar.Header{Name: n, Mode: mode}, body: body}
}
func tdir(n string, mode int64) tarEntry {
	return tarEntry{Header: tar.Header{Name: n, Typeflag: tar.TypeDir, Mode: mode}}
}
func tsymlink(n, target string) tarEntry {
	return tarEntry{Header: tar.Header{Name: n, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
}
func thardlink(n, target string) tarEntry {
	return tarEntry{Header: tar.Header{Name: n, Typeflag: tar.TypeLink, Linkname: target}}
}

// mkTar writes entries as a PAX tar (mtime testMtime unless set).
func mkTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.ModTime.IsZero() {
			h.ModTime = testMtime
		}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func diffIDOf(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

func opener(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// testImage is an image of the given layer tars (gzip-compressed, as a
// registry holds them) with config c.
func testImage(t testing.TB, arch string, c v1.Config, tars ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, b := range tars {
		l, err := tarball.LayerFromOpener(opener(b))
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", arch, c
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// unpackLayers is the two-layer image of TestOCIUnpackWhiteouts.
func unpackLayers(t testing.TB) (l1, l2 []byte) {
	setuid := tfile("bin/su", "su", 0o4755)
	ping := tfile("bin/ping", "ping", 0o755)
	ping.PAXRecords = map[string]string{capabilityPAXKey: string(testenv.CapV2())}
	home := tdir("home/user/", 0o750)
	home.Uid, home.Gid = 1000, 1000
	owned := tfile("home/user/f", "mine", 0o640)
	owned.Uid, owned.Gid = 1000, 1000
	null := tarEntry{Header: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}}
	fifo := tarEntry{Header: tar.Header{Name: "dev/fifo", Typeflag: tar.TypeFifo, Mode: 0o620}}
	l1 = mkTar(t,
		tdir("./", 0o755),
		tdir("etc/", 0o755),
		tfile("etc/keep", "keep\n", 0o644),
		tfile("etc/gone", "gone\n", 0o644),
		thardlink("etc/hard", "etc/keep"),
		tdir("opq/", 0o755),
		tfile("opq/old", "old", 0o644),
		tdir("bin/", 0o755),
		setuid, ping,
		tdir("home/", 0o755), home, owned,
		tdir("dev/", 0o755), null, fifo,
		tsymlink("link", "etc/keep"),
		tdir("re/", 0o755), tfile("re/old", "old", 0o644),
		tdir("re2/", 0o755), tfile("re2/old", "old", 0o644),
		tfile("same", "old", 0o644),
	)
	l2 = mkTar(t,
		// No entry for etc/ itself: created implicitly.
		tfile("etc/.wh.gone", "", 0o644),
		tdir("opq/", 0o755),
		tfile("opq/.wh..wh..opq", "", 0o644),
		tfile("opq/new", "new", 0o644),
		tfile("newfile", "2", 0o600),
		// Deleted and made anew in this layer, in either order: the
		// whiteout hides only lower layers' re/ (OCI image spec).
		tfile(".wh.re", "", 0o644), tdir("re/", 0o755), tfile("re/new", "new", 0o644),
		tdir("re2/", 0o755), tfile("re2/new", "new", 0o644), tfile(".wh.re2", "", 0o644),
		tfile("same", "new", 0o644), tfile(".wh.same", "", 0o644),
	)
	return l1, l2
}

func TestOCIUnpackWhiteouts(t *testing.T) {
	s := tempStore(t)
	ctx := context.Background()
	l1, l2 := unpackLayers(t)
	img := testImage(t, "amd64", v1.Config{}, l1, l2)
	tmpl, err := unpackImage(ctx, s, img, "", func(f string, a ...any) { t.Logf(f, a...) }, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"oci-" + diffIDOf(l1).Hex, "oci-" + diffIDOf(l2).Hex}
	if !slices.Equal(tmpl.Layers, want) {
		t.Fatalf("layers %v, want %v", tmpl.Layers, want)
	}
	if tmpl.User != "root" {
		t.Errorf("user %q, want root (the config has none)", tmpl.User)
	}
	d1, d2 := s.LayerDir(want[0]), s.LayerDir(want[1])

	// The layer dirs themselves: whiteouts in overlayfs form, times kept.
	testenv.AssertWhiteout(t, filepath.Join(d2, "etc", "gone"))
	if _, err := os.Lstat(filepath.Join(d2, "etc", ".wh.gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf(".wh.gone left in the layer: %v", err)
	}
	if v := testenv.Xattr(t, filepath.Join(d2, "opq"), opaqueXattr); v != "y" {
		t.Errorf("opq: %s = %q, want y", opaqueXattr, v)
	}
	if _, err := os.Lstat(filepath.Join(d2, "opq", whiteoutOpaque)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("opaque marker left in the layer: %v", err)
	}
	for _, p := range []string{filepath.Join(d1, "etc"), filepath.Join(d1, "etc", "keep"), filepath.Join(d1, "opq")} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(testMtime) {
			t.Errorf("%s: mtime %v, want %v", p, fi.ModTime(), testMtime)
		}
	}
	if a, b := testenv.Lstat(t, filepath.Join(d1, "etc", "keep")), testenv.Lstat(t, filepath.Join(d1, "etc", "hard")); a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("etc/hard is not a hard link of etc/keep: inodes %d, %d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if fi, err := os.Lstat(d1); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("layer root: %v %v, want mode 0755", fi.Mode(), err)
	}
	if tmps, _ := filepath.Glob(filepath.Join(s.Dir(), "layers", image.OCITempPrefix+"*")); len(tmps) > 0 {
		t.Errorf("temporary dirs left: %v", tmps)
	}

	// The merged view, as a sandbox sees it.
	roots, err := rootfs.Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	r, err := roots.Mount(ctx, "ocitest", []string{d1, d2}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Unmount(); err != nil {
			t.Error(err)
		}
		assertUnmounted(t, filepath.Dir(r.Dir()))
	}()
	m := r.Dir()
	if _, err := os.Lstat(filepath.Join(m, "etc", "gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("etc/gone is still visible: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(m, "etc", "keep")); err != nil || string(b) != "keep\n" {
		t.Errorf("etc/keep: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(m, "etc", "hard")); err != nil || string(b) != "keep\n" {
		t.Errorf("etc/hard: %q %v", b, err)
	}
	if names := testenv.DirNames(t, filepath.Join(m, "opq")); !slices.Equal(names, []string{"new"}) {
		t.Errorf("opaque dir shows %v, want only [new]", names)
	}
	if l, err := os.Readlink(filepath.Join(m, "link")); err != nil || l != "etc/keep" {
		t.Errorf("link -> %q %v", l, err)
	}
	if b, err := os.ReadFile(filepath.Join(m, "link")); err != nil || string(b) != "keep\n" {
		t.Errorf("reading through link: %q %v", b, err)
	}
	if st := testenv.Lstat(t, filepath.Join(m, "bin", "su")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("bin/su mode %o, want 4755 (setuid)", st.Mode&0o7777)
	}
	if v := testenv.Xattr(t, filepath.Join(m, "bin", "ping"), capabilityXattr); v != string(testenv.CapV2()) {
		t.Errorf("bin/ping capability %x, want %x", v, testenv.CapV2())
	}
	if st := testenv.Lstat(t, filepath.Join(m, "home", "user")); st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o750 {
		t.Errorf("home/user: uid %d gid %d mode %o, want 1000 1000 750", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if st := testenv.Lstat(t, filepath.Join(m, "home", "user", "f")); st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o640 {
		t.Errorf("home/user/f: uid %d gid %d mode %o, want 1000 1000 640", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if _, err := os.Lstat(filepath.Join(m, "dev", "null")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dev/null: %v, want the device node left out", err)
	}
	if st := testenv.Lstat(t, filepath.Join(m, "dev", "fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o777 != 0o620 {
		t.Errorf("dev/fifo: mode %o, want a fifo 0620", st.Mode)
	}
	if b, err := os.ReadFile(filepath.Join(m, "newfile")); err != nil || string(b) != "2" {
		t.Errorf("newfile: %q %v", b, err)
	}
	for _, d := range []string{"re", "re2"} {
		if names := testenv.DirNames(t, filepath.Join(m, d)); !slices.Equal(names, []string{"new"}) {
			t.Errorf("%s, deleted and made anew, shows %v, want only [new]", d, names)
		}
	}
	if b, err := os.ReadFile(filepath.Join(m, "same")); err != nil || string(b) != "new" {
		t.Errorf("same, replaced and then whited out in one layer: %q %v, want new", b, err)
	}
}

func TestUnpackEscapes(t *testing.T) {
	s := tempStore(t)
	outside := t.TempDir()
	cases := map[string][]byte{
		"dotdot":   mkTar(t, tfile("../escaped", "x", 0o644)),
		"dotdot2":  mkTar(t, tdir("a/", 0o755), tfile("a/../../escaped", "x", 0o644)),
		"absolute": mkTar(t, tfile(filepath.Join(outside, "abs"), "x", 0o644)),
		"symlink":  mkTar(t, tsymlink("a", outside), tfile("a/pwned", "x", 0o644)),
		"symlink-deep": mkTar(t, tdir("d/", 0o755), tsymlink("d/l", outside), tdir("d/l/sub/", 0o755),
			tfile("d/l/sub/pwned", "x", 0o644)),
		"symlink-dir-entry": mkTar(t, tsymlink("a", outside), tdir("a/made/", 0o755)),
		"symlink-whiteout":  mkTar(t, tsymlink("a", outside), tfile("a/.wh.victim", "", 0o644)),
		"symlink-opaque":    mkTar(t, tsymlink("a", outside), tfile("a/.wh..wh..opq", "", 0o644)),
		"hardlink-out":      mkTar(t, thardlink("h", "../../../etc/passwd")),
		"hardlink-abs":      mkTar(t, thardlink("h", "/etc/passwd")),
		"hardlink-through":  mkTar(t, tsymlink("a", "/etc"), thardlink("h", "a/passwd")),
		"symlink-replaced-dir": mkTar(t, tdir("a/", 0o755), tfile("a/ok", "x", 0o644), tsymlink("a", outside),
			tfile("a/pwned", "x", 0o644)),
	}
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("v"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			id, err := unpackLayer(context.Background(), s, diffIDOf(b), opener(b), nil)
			if err == nil {
				t.Fatalf("unpacked as %s; want an error", id)
			}
			t.Log(err)
			if tmps, _ := filepath.Glob(filepath.Join(s.Dir(), "layers", ".tmp-*")); len(tmps) > 0 {
				t.Errorf("temporary dirs left: %v", tmps)
			}
			if _, err := os.Lstat(s.LayerDir("oci-" + diffIDOf(b).Hex)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("layer dir made: %v", err)
			}
			for _, p := range []string{filepath.Join(s.Dir(), "layers", "escaped"), filepath.Join(s.Dir(), "escaped")} {
				if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s written: %v", p, err)
				}
			}
			if names := testenv.DirNames(t, outside); !slices.Equal(names, []string{"victim"}) {
				t.Errorf("written outside: %v", names)
			}
			if st := testenv.Lstat(t, filepath.Join(outside, "victim")); st.Mode&unix.S_IFMT != unix.S_IFREG {
				t.Errorf("victim replaced: mode %o", st.Mode)
			}
			if _, err := unix.Getxattr(outside, opaqueXattr, make([]byte, 8)); err == nil {
				t.Errorf("outside dir made opaque")
			}
		})
	}
}

// TestUnpackDeviceNodesAndSetuid: a layer's device nodes are left out
// (a whiteout, char 0:0, is not one), links to them too; setuid and
// setgid bits stay (sudo needs them), out of other local users' reach.
func TestUnpackDeviceNodesAndSetuid(t *testing.T) {
	s := tempStore(t)
	dev := func(n string, typ byte, major, minor int64) tarEntry {
		return tarEntry{Header: tar.Header{Name: n, Typeflag: typ, Mode: 0o666, Devmajor: major, Devminor: minor}}
	}
	rootbash := tfile("bin/rootbash", "#!/bin/sh\n", 0o4755)
	sgid := tfile("bin/sgid", "#!/bin/sh\n", 0o2755)
	b := mkTar(t,
		tdir("dev/", 0o755),
		dev("dev/sda", tar.TypeBlock, 8, 0),
		dev("dev/mem", tar.TypeChar, 1, 1),
		thardlink("dev/mem2", "dev/mem"),
		tfile("dev/replaced", "x", 0o644), dev("dev/replaced", tar.TypeBlock, 8, 1),
		dev("dev/wh", tar.TypeChar, 0, 0),
		tarEntry{Header: tar.Header{Name: "dev/fifo", Typeflag: tar.TypeFifo, Mode: 0o600}},
		tdir("bin/", 0o755), rootbash, sgid,
	)
	var progress []string
	id, err := unpackLayer(context.Background(), s, diffIDOf(b), opener(b), func(f string, a ...any) {
		progress = append(progress, fmt.Sprintf(f, a...))
	})
	if err != nil {
		t.Fatal(err)
	}
	l := s.LayerDir(id)
	if devs := deviceNodes(t, l); !slices.Equal(devs, []string{"dev/wh"}) {
		t.Errorf("device nodes in the layer: %v, want only the whiteout dev/wh", devs)
	}
	if names := testenv.DirNames(t, filepath.Join(l, "dev")); !slices.Equal(names, []string{"fifo", "wh"}) {
		t.Errorf("dev/ holds %v", names)
	}
	if !slices.ContainsFunc(progress, func(p string) bool { return strings.Contains(p, "left out 4 device node(s)") }) {
		t.Errorf("progress does not say devices were left out: %q", progress)
	}
	if st := testenv.Lstat(t, filepath.Join(l, "bin", "rootbash")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("rootbash: mode %o, want 4755", st.Mode&0o7777)
	}
	if st := testenv.Lstat(t, filepath.Join(l, "bin", "sgid")); st.Mode&0o7777 != 0o2755 {
		t.Errorf("sgid: mode %o, want 2755", st.Mode&0o7777)
	}
	// Another local user cannot reach the setuid program, even when the
	// way to the data dir is open: layers/ is root's.
	for d := s.Dir(); d != "/tmp" && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(l, "bin", "rootbash"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("nobody ran the layer's setuid program: %v %s", err, out)
	}
}

// deviceNodes lists the character and block devices below dir.
func deviceNodes(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeDevice != 0 {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUnpackRefusesSparse: a sparse tar entry declares its size in its
// header and archive/tar reads its holes back as zeros, so a layer of a
// few kilobytes could write any amount: refused. (1 GiB here, so that a
// regression does not fill the disk.)
func TestUnpackRefusesSparse(t *testing.T) {
	s := tempStore(t)
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 1<<30); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"gnu", "pax"} {
		t.Run(format, func(t *testing.T) {
			archive := filepath.Join(dir, format+".tar")
			if out, err := exec.Command("tar", "--sparse", "--format="+format, "-cf", archive, "-C", dir, "big").CombinedOutput(); err != nil {
				t.Skipf("GNU tar cannot make a sparse archive here: %v: %s", err, out)
			}
			b, err := os.ReadFile(archive)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) > 64<<10 {
				t.Fatalf("the archive is %d bytes: not sparse", len(b))
			}
			_, err = unpackLayer(context.Background(), s, diffIDOf(b), opener(b), nil)
			if err == nil {
				t.Fatal("a sparse entry was unpacked")
			}
			t.Log(err)
			if tmps, _ := filepath.Glob(filepath.Join(s.Dir(), "layers", ".tmp-*")); len(tmps) > 0 {
				t.Errorf("temporary dirs left: %v", tmps)
			}
		})
	}
}

// TestUnpackDiffIDMismatch checks that a layer whose content does not
// match the diffID it is unpacked as is refused: layer dirs are shared by
// that name.
func TestUnpackDiffIDMismatch(t *testing.T) {
	s := tempStore(t)
	b := mkTar(t, tfile("f", "x", 0o644))
	other := diffIDOf([]byte("something else"))
	if _, err := unpackLayer(context.Background(), s, other, opener(b), nil); err == nil || !strings.Contains(err.Error(), "diffID") {
		t.Fatalf("err = %v, want a diffID mismatch", err)
	}
	if _, err := os.Lstat(s.LayerDir("oci-" + other.Hex)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("layer dir made: %v", err)
	}
	if _, err := unpackLayer(context.Background(), s, v1.Hash{Algorithm: "sha256", Hex: "../../x"}, opener(b), nil); err == nil {
		t.Error("a malformed diffID was accepted")
	}
}

// testRegistry is an in-process registry on loopback that counts blob
// downloads.
type testRegistry struct {
	host string
	mu   sync.Mutex
	gets map[string]int // blob digest -> GETs
}

func startRegistry(t testing.TB, wrap func(http.Handler) http.Handler) (*testRegistry, http.Handler) {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr := &testRegistry{gets: map[string]int{}}
	count := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, d, ok := strings.Cut(r.URL.Path, "/blobs/"); ok && r.Method == http.MethodGet {
			tr.mu.Lock()
			tr.gets[d]++
			tr.mu.Unlock()
		}
		reg.ServeHTTP(w, r)
	})
	var h http.Handler = count
	if wrap != nil {
		h = wrap(count)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tr.host = strings.TrimPrefix(srv.URL, "http://")
	return tr, count
}

func (r *testRegistry) fetched(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gets[d.String()]
}

func push(t testing.TB, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

func layerDigests(t testing.TB, img v1.Image) []v1.Hash {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []v1.Hash
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// progressLog collects Progress lines.
type progressLog struct {
	t     testing.TB
	lines []string
}

func (p *progressLog) add(format string, args ...any) {
	line := strings.TrimSpace(fmt.Sprintf(format, args...))
	p.t.Log(line)
	p.lines = append(p.lines, line)
}

func (p *progressLog) count(sub string) int {
	n := 0
	for _, l := range p.lines {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

func TestPullFromRegistry(t *testing.T) {
	s := tempStore(t)
	reg, _ := startRegistry(t, nil)
	ctx := context.Background()
	l1 := mkTar(t, tdir("app/", 0o755), tfile("app/run", "#!/bin/sh\n", 0o755))
	l2 := mkTar(t, tfile("app/data", "data", 0o644))
	cfg := v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=a=b", "EMPTY="}, WorkingDir: "/app", User: "1000:1000"}
	amd := testImage(t, "amd64", cfg, l1, l2)
	arm := testImage(t, "arm64", cfg, mkTar(t, tfile("arm", "arm", 0o644)))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	ref, err := name.ParseReference(reg.host + "/test/img:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}

	p1 := &progressLog{t: t}
	tmpl, err := Pull(ctx, s, reg.host+"/test/img:1", PullOptions{Progress: p1.add, AllowInsecure: []string{reg.host}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"oci-" + diffIDOf(l1).Hex, "oci-" + diffIDOf(l2).Hex}
	if !slices.Equal(tmpl.Layers, want) {
		t.Fatalf("layers %v, want %v", tmpl.Layers, want)
	}
	if tmpl.ID != "" || tmpl.User != "1000:1000" || tmpl.Workdir != "/app" {
		t.Errorf("template %+v: want ID \"\", user 1000:1000, workdir /app", tmpl)
	}
	wantEnv := map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin", "GREETING": "a=b", "EMPTY": ""}
	if len(tmpl.Envs) != len(wantEnv) {
		t.Errorf("envs %v, want %v", tmpl.Envs, wantEnv)
	}
	for k, v := range wantEnv {
		if got, ok := tmpl.Envs[k]; !ok || got != v {
			t.Errorf("env %s = %q, want %q", k, got, v)
		}
	}
	if b, err := os.ReadFile(filepath.Join(s.LayerDir(want[1]), "app", "data")); err != nil || string(b) != "data" {
		t.Errorf("app/data: %q %v", b, err)
	}
	if st := testenv.Lstat(t, filepath.Join(s.LayerDir(want[0]), "app", "run")); st.Mode&0o777 != 0o755 {
		t.Errorf("app/run mode %o", st.Mode&0o777)
	}
	if n := p1.count("fetching"); n != 2 {
		t.Errorf("%d layers fetched, want 2", n)
	}
	for _, d := range layerDigests(t, amd) {
		if n := reg.fetched(d); n != 1 {
			t.Errorf("layer %s fetched %d times, want 1", d, n)
		}
	}
	for _, d := range layerDigests(t, arm) {
		if n := reg.fetched(d); n != 0 {
			t.Errorf("the arm64 image's layer %s was fetched", d)
		}
	}
	before := map[string]unix.Stat_t{}
	for _, id := range want {
		before[id] = testenv.Lstat(t, s.LayerDir(id))
	}

	// Again: nothing is fetched but the manifest and config.
	p2 := &progressLog{t: t}
	again, err := Pull(ctx, s, reg.host+"/test/img:1", PullOptions{Progress: p2.add, AllowInsecure: []string{reg.host}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Layers, want) {
		t.Errorf("second pull: layers %v", again.Layers)
	}
	if p2.count("fetching") != 0 || p2.count("already present") != 2 {
		t.Errorf("second pull fetched layers again: %q", p2.lines)
	}
	for _, d := range layerDigests(t, amd) {
		if n := reg.fetched(d); n != 1 {
			t.Errorf("layer %s fetched %d times after two pulls, want 1", d, n)
		}
	}
	for _, id := range want {
		if st := testenv.Lstat(t, s.LayerDir(id)); st.Ino != before[id].Ino || st.Mtim != before[id].Mtim {
			t.Errorf("layer dir %s was replaced", id)
		}
	}
}

func TestPullAuth(t *testing.T) {
	s := tempStore(t)
	// One registry, served twice: openly (to push) and behind basic auth.
	open, inner := startRegistry(t, nil)
	authed, _ := startRegistry(t, func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, r)
		})
	})
	l := mkTar(t, tfile("secret", "s", 0o600))
	push(t, open.host+"/private/img:1", testImage(t, "amd64", v1.Config{}, l))
	ref := authed.host + "/private/img:1"
	ctx := context.Background()

	_, err := Pull(ctx, s, ref, PullOptions{AllowInsecure: []string{authed.host}})
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), "authentication") || !strings.Contains(err.Error(), "anonymous") {
		t.Errorf("anonymous pull: err = %v, want one about authentication", err)
	}
	_, err = Pull(ctx, s, ref, PullOptions{Username: "alice", Password: "wrong", AllowInsecure: []string{authed.host}})
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), "authentication") || !strings.Contains(err.Error(), `"alice" failed`) {
		t.Errorf("wrong password: err = %v, want an authentication failure", err)
	}
	tmpl, err := Pull(ctx, s, ref, PullOptions{Username: "alice", Password: "s3cret", AllowInsecure: []string{authed.host}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tmpl.Layers, []string{"oci-" + diffIDOf(l).Hex}) {
		t.Errorf("layers %v", tmpl.Layers)
	}
}

func TestPullUnknown(t *testing.T) {
	s := tempStore(t)
	reg, _ := startRegistry(t, nil)
	push(t, reg.host+"/test/img:1", testImage(t, "amd64", v1.Config{}, mkTar(t, tfile("f", "f", 0o644))))
	for _, ref := range []string{reg.host + "/test/img:nope", reg.host + "/test/nothing:1"} {
		_, err := Pull(context.Background(), s, ref, PullOptions{AllowInsecure: []string{reg.host}})
		t.Log(err)
		if err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("%s: err = %v, want not found", ref, err)
		}
	}
	_, err := Pull(context.Background(), s, "Not A Reference", PullOptions{})
	if err == nil || !strings.Contains(err.Error(), "invalid image reference") {
		t.Errorf("err = %v, want an invalid reference", err)
	}
}

func TestPullMirror(t *testing.T) {
	s := tempStore(t)
	reg, _ := startRegistry(t, nil)
	l := mkTar(t, tfile("etc/os-release", "ID=x\n", 0o644))
	push(t, reg.host+"/library/x:1", testImage(t, "amd64", v1.Config{}, l))
	for _, ref := range []string{"docker.io/library/x:1", "x:1"} {
		p := &progressLog{t: t}
		tmpl, err := Pull(context.Background(), s, ref, PullOptions{Mirror: "http://" + reg.host, Progress: p.add})
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if !slices.Equal(tmpl.Layers, []string{"oci-" + diffIDOf(l).Hex}) || tmpl.User != "root" {
			t.Errorf("%s: template %+v", ref, tmpl)
		}
		if p.count("via mirror "+reg.host) != 1 {
			t.Errorf("%s: progress does not name the mirror: %q", ref, p.lines)
		}
	}
}

func TestPullOffline(t *testing.T) {
	s := tempStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	// Nothing listens on port 1.
	_, err := Pull(ctx, s, "127.0.0.1:1/x:1", PullOptions{AllowInsecure: []string{"127.0.0.1:1"}})
	took := time.Since(start)
	t.Logf("%v after %v", err, took)
	if err == nil || !strings.Contains(err.Error(), "cannot reach registry 127.0.0.1:1") ||
		!strings.Contains(err.Error(), "this machine may be offline") || !strings.Contains(err.Error(), "warren image import") ||
		!strings.Contains(err.Error(), "--registry-mirror") {
		t.Errorf("err = %v, want the offline advice", err)
	}
	if took > 5*time.Second {
		t.Errorf("took %v to fail", took)
	}
	// Through a mirror that is down, too.
	_, err = Pull(ctx, s, "debian:stable", PullOptions{Mirror: "http://127.0.0.1:1"})
	if err == nil || !strings.Contains(err.Error(), "cannot reach registry 127.0.0.1:1") {
		t.Errorf("err = %v, want the offline advice", err)
	}
}

// tarDir writes dir's files as a tar at dst, names relative to dir.
func tarDir(t testing.TB, dir, dst string) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name = rel
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestImportArchives(t *testing.T) {
	s := tempStore(t)
	ctx := context.Background()
	dir := t.TempDir()
	base := mkTar(t, tdir("etc/", 0o755), tfile("etc/base", "base", 0o644))
	top := mkTar(t, tfile("etc/top", "top", 0o644))
	cfg := v1.Config{Env: []string{"A=1"}, WorkingDir: "/w", User: "app"}
	img := testImage(t, "amd64", cfg, base, top)

	// docker save
	saved := filepath.Join(dir, "saved.tar")
	tag, err := name.NewTag("somewhere/else:9")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(saved, tag, img); err != nil {
		t.Fatal(err)
	}
	tmpl, err := Import(ctx, s, "myimage:1.0", saved)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"oci-" + diffIDOf(base).Hex, "oci-" + diffIDOf(top).Hex}
	if !slices.Equal(tmpl.Layers, want) || tmpl.User != "app" || tmpl.Workdir != "/w" || tmpl.Envs["A"] != "1" {
		t.Errorf("docker save import: %+v", tmpl)
	}
	if tmpl.Recipe != "myimage:1.0" || !image.ValidID(tmpl.ID) {
		t.Errorf("template ID %q recipe %q", tmpl.ID, tmpl.Recipe)
	}
	got, err := ImportedImage(s, "docker.io/library/myimage:1.0")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != tmpl.ID || !slices.Equal(got.Layers, want) {
		t.Errorf("ImportedImage: %+v, want %+v", got, tmpl)
	}
	if b, err := os.ReadFile(filepath.Join(s.LayerDir(want[1]), "etc", "top")); err != nil || string(b) != "top" {
		t.Errorf("etc/top: %q %v", b, err)
	}

	// The same, gzip-compressed.
	gz := filepath.Join(dir, "saved.tar.gz")
	raw, err := os.ReadFile(saved)
	if err != nil {
		t.Fatal(err)
	}
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(raw)
	zw.Close()
	if err := os.WriteFile(gz, zb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if tmpl, err := Import(ctx, s, "zipped", gz); err != nil || !slices.Equal(tmpl.Layers, want) {
		t.Errorf("gzip'd docker save: %+v %v", tmpl, err)
	}

	// An OCI layout holding an index of two platforms (as buildx writes
	// a multi-platform build), as a tar.
	other := mkTar(t, tfile("etc/other", "other", 0o644))
	img2 := testImage(t, "amd64", v1.Config{}, base, other)
	arm := testImage(t, "arm64", v1.Config{}, mkTar(t, tfile("arm", "arm", 0o644)))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img2, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationRefName: "2.0"})); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(dir, "oci.tar")
	tarDir(t, filepath.Join(dir, "layout"), ociTar)
	want2 := []string{"oci-" + diffIDOf(base).Hex, "oci-" + diffIDOf(other).Hex}
	baseIno := testenv.Lstat(t, s.LayerDir(want[0])).Ino
	tmpl2, err := Import(ctx, s, "other", ociTar)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tmpl2.Layers, want2) || tmpl2.User != "root" || tmpl2.Recipe != "other:latest" {
		t.Errorf("OCI import: %+v", tmpl2)
	}
	if testenv.Lstat(t, s.LayerDir(want[0])).Ino != baseIno {
		t.Error("the shared base layer was unpacked again")
	}
	for _, n := range []string{"other", "other:latest", "docker.io/library/other:latest", "index.docker.io/library/other"} {
		if got, err := ImportedImage(s, n); err != nil || got.ID != tmpl2.ID {
			t.Errorf("ImportedImage(%q): %+v %v", n, got, err)
		}
	}
	if _, err := ImportedImage(s, "other:2"); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("ImportedImage(other:2): %v, want image.ErrNotFound", err)
	}

	// A second import of a name replaces the first.
	if _, err := Import(ctx, s, "myimage:1.0", ociTar); err != nil {
		t.Fatal(err)
	}
	if got, err := ImportedImage(s, "myimage:1.0"); err != nil || !slices.Equal(got.Layers, want2) {
		t.Errorf("after re-import: %+v %v", got, err)
	}

	// Not an image archive.
	junk := filepath.Join(dir, "junk.tar")
	if err := os.WriteFile(junk, mkTar(t, tfile("hello", "x", 0o644)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Import(ctx, s, "junk", junk); err == nil || !strings.Contains(err.Error(), "not an image archive") {
		t.Errorf("junk: err = %v", err)
	}
	if tmps, _ := filepath.Glob(filepath.Join(s.Dir(), "layers", image.OCITempPrefix+"*")); len(tmps) > 0 {
		t.Errorf("temporary dirs left: %v", tmps)
	}
}

func TestImportNameNormalisation(t *testing.T) {
	for in, want := range map[string]string{
		"x":                                   "x:latest",
		"x:1":                                 "x:1",
		"docker.io/library/x:1":               "x:1",
		"index.docker.io/library/x":           "x:latest",
		"docker.io/u/x":                       "u/x:latest",
		"ghcr.io/a/b:2":                       "ghcr.io/a/b:2",
		"localhost:5000/a":                    "localhost:5000/a:latest",
		"library/a/b":                         "library/a/b:latest",
		"x@sha256:" + strings.Repeat("a", 64): "x@sha256:" + strings.Repeat("a", 64),
	} {
		got, err := normaliseImageName(in)
		if err != nil || got != want {
			t.Errorf("normaliseImageName(%q) = %q, %v; want %q", in, got, err, want)
		}
		if id := importedTemplateID(got); !image.ValidID(id) {
			t.Errorf("template ID %q is invalid", id)
		}
	}
	if _, err := normaliseImageName("UPPER CASE"); err == nil {
		t.Error("an invalid name was accepted")
	}
}

// TestUnpackStopsAtTheSpaceGuard checks that a layer larger than the node
// may take (a compressed bomb, a huge image) stops once the store's space
// guard objects, and leaves no half-made layer.
func TestUnpackStopsAtTheSpaceGuard(t *testing.T) {
	s := tempStore(t)
	var calls int
	s.GuardSpace(func() error {
		calls++
		if calls >= 2 {
			return errors.New("below the reserve")
		}
		return nil
	})
	// Zeros compress to almost nothing: what a bomb looks like.
	big := bytes.Repeat([]byte{0}, 3*unpackGuardEvery)
	b := mkTar(t, tfile("zeros", string(big), 0o644))
	_, err := unpackLayer(context.Background(), s, diffIDOf(b), opener(b), nil)
	if err == nil || !strings.Contains(err.Error(), "below the reserve") {
		t.Fatalf("err = %v, want the guard's", err)
	}
	if calls != 2 {
		t.Errorf("guard called %d times, want 2 (once per %d bytes until it objects)", calls, unpackGuardEvery)
	}
	if tmps, _ := filepath.Glob(filepath.Join(s.Dir(), "layers", ".tmp-*")); len(tmps) > 0 {
		t.Errorf("temporary dirs left: %v", tmps)
	}
	if _, err := os.Lstat(s.LayerDir("oci-" + diffIDOf(b).Hex)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("layer dir made: %v", err)
	}
}

// TestPulledLayersArePerTeam: a team's pull never answers from another
// team's layers. Team A pulls its private image with its credentials;
// team B then pulls, without them, an image of its own registry whose
// config claims A's layer's diffID: B's layer is fetched from B's
// registry (and fails to match), never taken from A's, and B's pull of
// an image with a layer A has tells B nothing (it is fetched as well).
func TestPulledLayersArePerTeam(t *testing.T) {
	s := tempStore(t)
	open, inner := startRegistry(t, nil)
	private, _ := startRegistry(t, func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, r)
		})
	})
	secret := mkTar(t, tfile("secret", "team A's", 0o600))
	push(t, open.host+"/a/private:1", testImage(t, "amd64", v1.Config{}, secret))
	ctx := context.Background()
	allow := []string{open.host, private.host}
	a, err := Pull(ctx, s, private.host+"/a/private:1", PullOptions{Team: "A", Username: "alice", Password: "s3cret", AllowInsecure: allow})
	if err != nil {
		t.Fatal(err)
	}

	// B's image: its own layer, under a config that names A's diffID.
	bogus := mkTar(t, tfile("mine", "team B's", 0o644))
	img := testImage(t, "amd64", v1.Config{}, bogus)
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.RootFS.DiffIDs = []v1.Hash{diffIDOf(secret)}
	claim, err := mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	push(t, open.host+"/b/claim:1", claim)
	p := &progressLog{t: t}
	got, err := Pull(ctx, s, open.host+"/b/claim:1", PullOptions{Team: "B", AllowInsecure: allow, Progress: p.add})
	if err == nil {
		t.Errorf("team B got team A's private layer from the cache: layers %v (A's %v)", got.Layers, a.Layers)
	}
	if p.count("already present") != 0 {
		t.Errorf("B's pull answered from the cache: %q", p.lines)
	}

	// B's own image with the same layer as A's (B has the content): it is
	// fetched for B, not found present.
	push(t, open.host+"/b/same:1", testImage(t, "amd64", v1.Config{}, secret))
	p = &progressLog{t: t}
	if _, err := Pull(ctx, s, open.host+"/b/same:1", PullOptions{Team: "B", AllowInsecure: allow, Progress: p.add}); err != nil {
		t.Fatal(err)
	}
	if p.count("already present") != 0 || p.count("fetching") != 1 {
		t.Errorf("B's pull of a layer A has: %q", p.lines)
	}
	// Within a team, the cache answers.
	p = &progressLog{t: t}
	if _, err := Pull(ctx, s, open.host+"/b/same:1", PullOptions{Team: "B", AllowInsecure: allow, Progress: p.add}); err != nil {
		t.Fatal(err)
	}
	if p.count("already present") != 1 {
		t.Errorf("B's second pull: %q", p.lines)
	}
}
