package rootfs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/testenv"
	"golang.org/x/sys/unix"
)

// Extended attributes a committed layer keeps.
const (
	capabilityXattr = "security.capability"
	opaqueXattr     = "trusted.overlay.opaque"
)

// TestCommitCopiesTheUpperDir writes everything a layer can hold through
// a disk-limited sandbox's overlay, commits it, and checks the layer and
// an overlay over it.
func TestCommitCopiesTheUpperDir(t *testing.T) {
	s, l1 := tinyStore(t)
	ctx := context.Background()
	// A lower layer with things to delete and to replace.
	for p, body := range map[string]string{"gone": "gone", "opq/old": "old", "keep": "keep"} {
		if err := os.MkdirAll(filepath.Join(l1, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(l1, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := s.Mount(ctx, "commit1", []string{l1}, 64)
	if err != nil {
		t.Fatal(err)
	}
	m := r.Dir()
	at := func(p string) string { return filepath.Join(m, p) }
	when := time.Date(2021, 2, 3, 4, 5, 6, 7000, time.UTC)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(at("home/user/deep/er"), 0o755))
	must(os.WriteFile(at("home/user/f"), []byte("mine"), 0o640))
	must(os.Chown(at("home/user/f"), 1000, 1001))
	must(os.Chown(at("home/user"), 1000, 1000))
	must(os.Chmod(at("home/user"), 0o750))
	must(os.Link(at("home/user/f"), at("home/user/deep/er/hard")))
	must(os.WriteFile(at("suid"), []byte("#!/bin/sh\n"), 0o755))
	must(unix.Chmod(at("suid"), 0o4755))
	must(os.WriteFile(at("ping"), []byte("ping"), 0o755))
	must(unix.Setxattr(at("ping"), capabilityXattr, testenv.CapV2(), 0))
	must(unix.Setxattr(at("ping"), "user.note", []byte("hello"), 0))
	must(os.Symlink("home/user/f", at("link")))
	must(unix.Lchown(at("link"), 1000, 1000))
	must(unix.Mkfifo(at("fifo"), 0o620))
	must(os.Chmod(at("fifo"), 0o620))
	must(os.Remove(at("gone")))
	must(os.RemoveAll(at("opq")))
	must(os.Mkdir(at("opq"), 0o755))
	must(os.WriteFile(at("opq/new"), []byte("new"), 0o644))
	must(os.MkdirAll(at("dev"), 0o755))
	must(unix.Mknod(at("dev/sda"), unix.S_IFBLK|0o666, int(unix.Mkdev(8, 0))))
	must(unix.Mknod(at("dev/mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))))
	// 1 TiB apparent, 4 KiB of data at 512 GiB.
	f, err := os.Create(at("sparse"))
	must(err)
	must(f.Truncate(1 << 40))
	_, err = f.WriteAt(make([]byte, 4096), 1<<39)
	must(err)
	must(f.Close())
	for _, p := range []string{"home/user/f", "suid", "home/user/deep/er", "home/user"} {
		must(os.Chtimes(at(p), when, when))
	}

	if err := r.Commit(s.Store, "c1"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "commit1")
	if tmps, _ := filepath.Glob(filepath.Join(s.Dir(), "layers", image.CommitTempPrefix+"*")); len(tmps) > 0 {
		t.Errorf("temporary dirs left: %v", tmps)
	}
	l := s.LayerDir("c1")
	in := func(p string) string { return filepath.Join(l, p) }

	if st := testenv.Lstat(t, in("home/user/f")); st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o640 || st.Nlink != 2 {
		t.Errorf("home/user/f: uid %d gid %d mode %o nlink %d, want 1000 1001 640 2", st.Uid, st.Gid, st.Mode&0o7777, st.Nlink)
	}
	if a, b := testenv.Lstat(t, in("home/user/f")), testenv.Lstat(t, in("home/user/deep/er/hard")); a.Ino != b.Ino {
		t.Error("the hard link became a copy")
	}
	if st := testenv.Lstat(t, in("home/user")); st.Uid != 1000 || st.Mode&0o7777 != 0o750 {
		t.Errorf("home/user: uid %d mode %o, want 1000 750", st.Uid, st.Mode&0o7777)
	}
	for _, p := range []string{"home/user/f", "suid", "home/user/deep/er", "home/user"} {
		if fi, err := os.Lstat(in(p)); err != nil || !fi.ModTime().Equal(when) {
			t.Errorf("%s: mtime %v %v, want %v", p, fi.ModTime(), err, when)
		}
	}
	if st := testenv.Lstat(t, in("suid")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("suid: mode %o, want 4755", st.Mode&0o7777)
	}
	if v := testenv.Xattr(t, in("ping"), capabilityXattr); v != string(testenv.CapV2()) {
		t.Errorf("ping: capability %x, want %x", v, testenv.CapV2())
	}
	if v := testenv.Xattr(t, in("ping"), "user.note"); v != "hello" {
		t.Errorf("ping: user.note %q", v)
	}
	if target, err := os.Readlink(in("link")); err != nil || target != "home/user/f" {
		t.Errorf("link -> %q %v", target, err)
	}
	if st := testenv.Lstat(t, in("link")); st.Uid != 1000 {
		t.Errorf("link owned by %d, want 1000", st.Uid)
	}
	if st := testenv.Lstat(t, in("fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o777 != 0o620 {
		t.Errorf("fifo: mode %o", st.Mode)
	}
	testenv.AssertWhiteout(t, in("gone"))
	if v := testenv.Xattr(t, in("opq"), opaqueXattr); v != "y" {
		t.Errorf("opq: %s = %q, want y", opaqueXattr, v)
	}
	if names := testenv.DirNames(t, in("dev")); len(names) != 0 {
		t.Errorf("device nodes in the layer: %v", names)
	}
	st := testenv.Lstat(t, in("sparse"))
	if st.Size != 1<<40 || st.Blocks*512 > 1<<20 {
		t.Errorf("sparse: size %d, %d bytes allocated; want 1 TiB in a few KiB", st.Size, st.Blocks*512)
	}
	if fi, err := os.Lstat(l); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("layer root: %v %v, want 0755", fi.Mode(), err)
	}

	// As a lower layer: the whiteout and the opaque dir hide l1's files.
	r2, err := s.Mount(ctx, "commit2", []string{l1, l}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Unmount()
	if _, err := os.Lstat(filepath.Join(r2.Dir(), "gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("gone is visible over the committed layer: %v", err)
	}
	if names := testenv.DirNames(t, filepath.Join(r2.Dir(), "opq")); !slices.Equal(names, []string{"new"}) {
		t.Errorf("opq shows %v, want [new]", names)
	}
	if b, err := os.ReadFile(filepath.Join(r2.Dir(), "keep")); err != nil || string(b) != "keep" {
		t.Errorf("keep: %q %v", b, err)
	}
}

// TestCommitKeepsAnExistingLayer: a layer made meanwhile by another build
// wins, and a bad layer ID fails; the sandbox is gone either way.
func TestCommitKeepsAnExistingLayer(t *testing.T) {
	s, l1 := tinyStore(t)
	ctx := context.Background()
	if err := os.MkdirAll(filepath.Join(s.LayerDir("dup"), "theirs"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := s.Mount(ctx, "commit3", []string{l1}, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.Dir(), "mine"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(s.Store, "dup"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s, "commit3")
	if names := testenv.DirNames(t, s.LayerDir("dup")); !slices.Equal(names, []string{"theirs"}) {
		t.Errorf("existing layer now holds %v", names)
	}
	r, err = s.Mount(ctx, "commit4", []string{l1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(s.Store, "../bad"); err == nil {
		t.Error("Commit with a bad layer ID succeeded")
	}
	assertGone(t, s, "commit4")
}
