package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

func uidOf(t *testing.T, path string) uint32 {
	t.Helper()
	fi, err := os.Lstat(path)
	must(t, err)
	return fi.Sys().(*syscall.Stat_t).Uid
}

func TestMakeDirOwnedByUser(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "x", "y")
	res, err := env.c.MakeDir(context.Background(), req(&pb.MakeDirRequest{Path: target}, "nobody"))
	must(t, err)
	if e := res.Msg.Entry; e.Path != target || e.Name != "y" || e.Owner != "nobody" || e.Type != pb.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("entry = %v", e)
	}
	for _, p := range []string{filepath.Join(dir, "x"), target} {
		if uid := uidOf(t, p); uid != 65534 {
			t.Errorf("%s owned by uid %d, want nobody", p, uid)
		}
	}
	// Without a user header the default user (root here) owns it.
	rootDir := filepath.Join(dir, "r")
	_, err = env.c.MakeDir(context.Background(), req(&pb.MakeDirRequest{Path: rootDir}, ""))
	must(t, err)
	if uid := uidOf(t, rootDir); uid != 0 {
		t.Errorf("default user: uid %d, want 0", uid)
	}
}

func TestMakeDirErrors(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	writeFile(t, file, "")
	must(t, os.Symlink("nowhere", filepath.Join(dir, "dangling")))
	must(t, os.Symlink(dir, filepath.Join(dir, "dirlink")))

	for _, tc := range []struct {
		path string
		code connect.Code
	}{
		{dir, connect.CodeAlreadyExists},
		{filepath.Join(dir, "dirlink"), connect.CodeAlreadyExists},
		{file, connect.CodeInvalidArgument},
		{filepath.Join(dir, "dangling"), connect.CodeInvalidArgument},
		{filepath.Join(file, "below"), connect.CodeInvalidArgument},
		{filepath.Join(file, "deeper", "below"), connect.CodeInvalidArgument},
	} {
		_, err := env.c.MakeDir(context.Background(), req(&pb.MakeDirRequest{Path: tc.path}, ""))
		wantCode(t, tc.path, err, tc.code)
	}
}

func TestMakeDirPermissionDenied(t *testing.T) {
	// sysfs refuses new entries even to root: a real EACCES to map.
	probe := "/sys/warren-fs-probe"
	if err := os.Mkdir(probe, 0o755); !errors.Is(err, fs.ErrPermission) {
		os.Remove(probe)
		t.Skipf("mkdir in /sys gives %v here, not EACCES", err)
	}
	env := newTestEnv(t)
	_, err := env.c.MakeDir(context.Background(), req(&pb.MakeDirRequest{Path: "/sys/warren-fs-test/x"}, ""))
	wantCode(t, "mkdir in /sys", err, connect.CodePermissionDenied)
}

func TestRelativeAndTildePathsResolveAgainstHome(t *testing.T) {
	env := newTestEnv(t)
	name := "warren-fs-test-" + filepath.Base(t.TempDir())
	home := "/root" // the test service's default user
	t.Cleanup(func() { os.RemoveAll(filepath.Join(home, name)) })
	res, err := env.c.MakeDir(context.Background(), req(&pb.MakeDirRequest{Path: name + "/sub"}, ""))
	must(t, err)
	if res.Msg.Entry.Path != filepath.Join(home, name, "sub") {
		t.Errorf("relative path resolved to %q", res.Msg.Entry.Path)
	}
	st, err := env.c.Stat(context.Background(), req(&pb.StatRequest{Path: "~/" + name}, ""))
	must(t, err)
	if st.Msg.Entry.Path != filepath.Join(home, name) {
		t.Errorf("~ path resolved to %q", st.Msg.Entry.Path)
	}
	ls, err := env.c.ListDir(context.Background(), req(&pb.ListDirRequest{Path: name}, ""))
	must(t, err)
	if len(ls.Msg.Entries) != 1 || ls.Msg.Entries[0].Path != filepath.Join(home, name, "sub") {
		t.Errorf("relative listing = %v", ls.Msg.Entries)
	}
}

func TestMove(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.txt")
	writeFile(t, src, "x")
	dst := filepath.Join(dir, "new", "dir", "dst.txt")

	res, err := env.c.Move(context.Background(), req(&pb.MoveRequest{Source: src, Destination: dst}, "nobody"))
	must(t, err)
	if e := res.Msg.Entry; e.Path != dst || e.Name != "dst.txt" || e.Size != 1 || e.Type != pb.FileType_FILE_TYPE_FILE {
		t.Errorf("entry = %v", e)
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Error("source still exists")
	}
	// Created parents belong to the user; the moved file keeps its owner.
	for _, p := range []string{filepath.Join(dir, "new"), filepath.Join(dir, "new", "dir")} {
		if uid := uidOf(t, p); uid != 65534 {
			t.Errorf("%s owned by uid %d, want nobody", p, uid)
		}
	}
	if uid := uidOf(t, dst); uid != 0 {
		t.Errorf("moved file owned by %d, want root still", uid)
	}

	// A directory moves with its content.
	res, err = env.c.Move(context.Background(), req(&pb.MoveRequest{Source: filepath.Join(dir, "new"), Destination: filepath.Join(dir, "moved")}, ""))
	must(t, err)
	if res.Msg.Entry.Type != pb.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("dir entry = %v", res.Msg.Entry)
	}
	if _, err := os.Stat(filepath.Join(dir, "moved", "dir", "dst.txt")); err != nil {
		t.Errorf("content not moved: %v", err)
	}

	file := filepath.Join(dir, "plain")
	writeFile(t, file, "")
	full := filepath.Join(dir, "full")
	must(t, os.MkdirAll(filepath.Join(full, "content"), 0o755))
	for _, tc := range []struct {
		what     string
		src, dst string
		code     connect.Code
	}{
		{"missing source", src, dst, connect.CodeNotFound},
		{"destination below a file", file, filepath.Join(file, "x", "y"), connect.CodeInvalidArgument},
		{"directory into itself", filepath.Join(dir, "moved"), filepath.Join(dir, "moved", "dir", "in"), connect.CodeInvalidArgument},
		{"over a non-empty directory", filepath.Join(dir, "moved"), full, connect.CodeAlreadyExists},
		{"empty source", "", dst, connect.CodeInvalidArgument},
		{"empty destination", file, "", connect.CodeInvalidArgument},
	} {
		_, err := env.c.Move(context.Background(), req(&pb.MoveRequest{Source: tc.src, Destination: tc.dst}, ""))
		wantCode(t, tc.what, err, tc.code)
	}
}

func TestRemove(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	must(t, os.MkdirAll(filepath.Join(tree, "a", "b"), 0o755))
	writeFile(t, filepath.Join(tree, "a", "b", "f"), "x")
	keep := filepath.Join(dir, "keep")
	must(t, os.Mkdir(keep, 0o755))
	writeFile(t, filepath.Join(keep, "k"), "x")
	link := filepath.Join(dir, "link")
	must(t, os.Symlink(keep, link))

	_, err := env.c.Remove(context.Background(), req(&pb.RemoveRequest{Path: tree}, ""))
	must(t, err)
	if _, err := os.Lstat(tree); !os.IsNotExist(err) {
		t.Error("directory not removed recursively")
	}
	// A symlink goes, its target stays.
	_, err = env.c.Remove(context.Background(), req(&pb.RemoveRequest{Path: link}, ""))
	must(t, err)
	if _, err := os.Lstat(link); !os.IsNotExist(err) {
		t.Error("link not removed")
	}
	if _, err := os.Stat(filepath.Join(keep, "k")); err != nil {
		t.Errorf("link target damaged: %v", err)
	}

	// What is not there is removed already (E2B's envd: os.RemoveAll).
	_, err = env.c.Remove(context.Background(), req(&pb.RemoveRequest{Path: tree}, ""))
	must(t, err)
	_, err = env.c.Remove(context.Background(), req(&pb.RemoveRequest{Path: ""}, ""))
	wantCode(t, "empty path", err, connect.CodeInvalidArgument)
	if _, err := os.Stat("/root"); err != nil {
		t.Fatalf("home gone: %v", err)
	}
}

func TestErrorCodes(t *testing.T) {
	pe := func(errno syscall.Errno) error { return &os.PathError{Op: "op", Path: "/p", Err: errno} }
	for _, tc := range []struct {
		err  error
		code connect.Code
	}{
		{pe(syscall.ENOENT), connect.CodeNotFound},
		{pe(syscall.EEXIST), connect.CodeAlreadyExists},
		{pe(syscall.ENOTEMPTY), connect.CodeAlreadyExists},
		{pe(syscall.EACCES), connect.CodePermissionDenied},
		{pe(syscall.EPERM), connect.CodePermissionDenied},
		{pe(syscall.EROFS), connect.CodePermissionDenied},
		{pe(syscall.ENOTDIR), connect.CodeInvalidArgument},
		{pe(syscall.EINVAL), connect.CodeInvalidArgument},
		{pe(syscall.ELOOP), connect.CodeInvalidArgument},
		{pe(syscall.ENOSPC), connect.CodeResourceExhausted},
		{pe(syscall.EIO), connect.CodeInternal},
		{pe(syscall.EXDEV), connect.CodeInternal},
		{invalidArgument("x"), connect.CodeInvalidArgument},
	} {
		err := fsError(tc.err, "doing %s", "it")
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%v → %v, want %v", tc.err, connect.CodeOf(err), tc.code)
		}
		if tc.code != connect.CodeInvalidArgument || !errors.Is(tc.err, syscall.EINVAL) {
			continue
		}
		if want := fmt.Sprintf("doing it: %v", tc.err); err.(*connect.Error).Message() != want {
			t.Errorf("message %q, want %q", err.(*connect.Error).Message(), want)
		}
	}
}
