package filesystem

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

func TestListDirDepth(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "a", "b", "c"), 0o755))
	writeFile(t, filepath.Join(dir, "f"), "12345")
	writeFile(t, filepath.Join(dir, "a", "g"), "")
	must(t, os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "ln")))

	list := func(path string, depth uint32) ([]string, []*pb.EntryInfo) {
		t.Helper()
		res, err := env.c.ListDir(context.Background(), req(&pb.ListDirRequest{Path: path, Depth: depth}, ""))
		must(t, err)
		var rel []string
		for _, e := range res.Msg.Entries {
			if !filepath.IsAbs(e.Path) || filepath.Base(e.Path) != e.Name {
				t.Errorf("entry path %q name %q", e.Path, e.Name)
			}
			r, _ := filepath.Rel(path, e.Path)
			rel = append(rel, r)
		}
		slices.Sort(rel)
		return rel, res.Msg.Entries
	}
	for _, tc := range []struct {
		depth uint32
		want  []string
	}{
		{0, []string{"a", "f", "ln"}},
		{1, []string{"a", "f", "ln"}},
		{2, []string{"a", "a/b", "a/g", "f", "ln"}},
		// The symlink to a is never followed, however deep.
		{10, []string{"a", "a/b", "a/b/c", "a/g", "f", "ln"}},
	} {
		if got, _ := list(dir, tc.depth); !slices.Equal(got, tc.want) {
			t.Errorf("depth %d → %v, want %v", tc.depth, got, tc.want)
		}
	}

	_, entries := list(dir, 1)
	aInfo, err := os.Stat(filepath.Join(dir, "a"))
	must(t, err)
	aMode := aInfo.Mode()
	byName := map[string]*pb.EntryInfo{}
	for _, e := range entries {
		byName[e.Name] = e
	}
	if e := byName["f"]; e.Type != pb.FileType_FILE_TYPE_FILE || e.Size != 5 || e.Owner != "root" || e.ModifiedTime == nil {
		t.Errorf("f = %v", e)
	}
	if e := byName["a"]; e.Type != pb.FileType_FILE_TYPE_DIRECTORY || e.Mode != uint32(aMode.Perm()) {
		t.Errorf("a = %v", e)
	}
	// A link is listed with its target's type (as E2B's envd does), but not
	// descended into.
	if e := byName["ln"]; e.Type != pb.FileType_FILE_TYPE_DIRECTORY || e.GetSymlinkTarget() != filepath.Join(dir, "a") {
		t.Errorf("ln = %v", e)
	}

	// A symlinked directory itself can be listed; paths stay under the link.
	if got, _ := list(filepath.Join(dir, "ln"), 1); !slices.Equal(got, []string{"b", "g"}) {
		t.Errorf("listing through the link → %v", got)
	}
}

func TestListDirErrors(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), "")
	for _, tc := range []struct {
		path string
		code connect.Code
	}{
		{filepath.Join(dir, "f"), connect.CodeInvalidArgument},
		{filepath.Join(dir, "nope"), connect.CodeNotFound},
	} {
		_, err := env.c.ListDir(context.Background(), req(&pb.ListDirRequest{Path: tc.path}, ""))
		wantCode(t, tc.path, err, tc.code)
	}
	// An empty directory lists as no entries, not an error.
	res, err := env.c.ListDir(context.Background(), req(&pb.ListDirRequest{Path: t.TempDir(), Depth: 3}, ""))
	must(t, err)
	if len(res.Msg.Entries) != 0 {
		t.Errorf("empty dir → %v", res.Msg.Entries)
	}
}
