package filesystem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

func TestStatFileDirAndErrors(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "a.txt")
	writeFile(t, file, "abc")
	must(t, os.Chmod(file, 0o640))

	res, err := env.c.Stat(context.Background(), req(&pb.StatRequest{Path: file}, ""))
	must(t, err)
	e := res.Msg.Entry
	if e.Name != "a.txt" || e.Path != file || e.Size != 3 || e.Type != pb.FileType_FILE_TYPE_FILE ||
		e.Mode != 0o640 || e.Permissions != "-rw-r-----" || e.Owner != "root" || e.Group != "root" ||
		e.ModifiedTime == nil || e.SymlinkTarget != nil {
		t.Errorf("file entry = %v", e)
	}

	sub := filepath.Join(dir, "d")
	must(t, os.Mkdir(sub, 0o755))
	must(t, os.Chmod(sub, 0o755)) // regardless of umask
	res, err = env.c.Stat(context.Background(), req(&pb.StatRequest{Path: sub}, ""))
	must(t, err)
	// The permission bits only, as E2B's envd reports them (not Go's
	// os.FileMode, whose directory bit would make it 2147484141).
	if d := res.Msg.Entry; d.Type != pb.FileType_FILE_TYPE_DIRECTORY || d.Mode != 0o755 || d.Permissions != "drwxr-xr-x" {
		t.Errorf("dir entry = %v", d)
	}
	// Nor setuid, setgid or sticky bits: /tmp-like 1777 reads 0o777.
	must(t, os.Chmod(sub, os.ModeSticky|0o777))
	res, err = env.c.Stat(context.Background(), req(&pb.StatRequest{Path: sub}, ""))
	must(t, err)
	if d := res.Msg.Entry; d.Mode != 0o777 || d.Permissions != "dtrwxrwxrwx" {
		t.Errorf("sticky dir entry = mode %o, permissions %q", d.Mode, d.Permissions)
	}

	_, err = env.c.Stat(context.Background(), req(&pb.StatRequest{Path: filepath.Join(dir, "missing")}, ""))
	wantCode(t, "missing", err, connectNotFound)
	_, err = env.c.Stat(context.Background(), req(&pb.StatRequest{Path: filepath.Join(file, "below-a-file")}, ""))
	wantCode(t, "below a file", err, connectInvalidArgument)
	_, err = env.c.Stat(context.Background(), req(&pb.StatRequest{Path: dir}, "no-such-user-xyz"))
	wantCode(t, "unknown user", err, connectUnauthenticated)
	// E2B's envd's words, which the SDK shows.
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Message() != "invalid username: 'no-such-user-xyz'" {
		t.Errorf("unknown user's message: %v", err)
	}
	_, err = env.c.Stat(context.Background(), req(&pb.StatRequest{Path: "bad\x00path"}, ""))
	wantCode(t, "NUL in path", err, connectInvalidArgument)
}

func TestStatSymlinks(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "target.txt")
	writeFile(t, file, "x")
	must(t, os.Chmod(file, 0o640))
	sub := filepath.Join(dir, "sub")
	must(t, os.Mkdir(sub, 0o750))
	must(t, os.Chmod(sub, 0o750))
	must(t, os.Symlink("sub", filepath.Join(dir, "dirlink")))
	must(t, os.Symlink("loop", filepath.Join(dir, "loop")))
	must(t, os.Symlink("target.txt", filepath.Join(dir, "l1")))
	must(t, os.Symlink("l1", filepath.Join(dir, "l2")))
	must(t, os.Symlink("nowhere", filepath.Join(dir, "dangling")))

	stat := func(name string) *pb.EntryInfo {
		res, err := env.c.Stat(context.Background(), req(&pb.StatRequest{Path: filepath.Join(dir, name)}, ""))
		must(t, err)
		return res.Msg.Entry
	}
	// A chain is resolved to its end, as E2B does: the link's name and
	// size, its target's type and permission bits.
	if e := stat("l2"); e.Type != pb.FileType_FILE_TYPE_FILE || e.GetSymlinkTarget() != file ||
		e.Mode != 0o640 || e.Name != "l2" || e.Size != int64(len("l1")) || !strings.HasPrefix(e.Permissions, "L") {
		t.Errorf("chained link = %v", e)
	}
	if e := stat("dirlink"); e.Type != pb.FileType_FILE_TYPE_DIRECTORY || e.GetSymlinkTarget() != sub || e.Mode != 0o750 {
		t.Errorf("link to a directory = %v", e)
	}
	// A link that leads nowhere has no type and names itself (E2B's envd).
	for _, name := range []string{"dangling", "loop"} {
		if e := stat(name); e.Type != pb.FileType_FILE_TYPE_UNSPECIFIED || e.GetSymlinkTarget() != filepath.Join(dir, name) || e.Mode != 0 {
			t.Errorf("%s link = %v", name, e)
		}
	}
}

func TestEntryOwnerNamesAndNumbers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	writeFile(t, file, "")
	must(t, os.Chown(file, 65534, 65534))
	e, err := EntryInfo(file)
	must(t, err)
	if e.Owner != "nobody" || e.Group != "nogroup" {
		t.Errorf("owner/group = %q/%q, want nobody/nogroup", e.Owner, e.Group)
	}
	// Ids no account has are shown as numbers.
	must(t, os.Chown(file, 54321, 54322))
	e, err = EntryInfo(file)
	must(t, err)
	if e.Owner != "54321" || e.Group != "54322" {
		t.Errorf("owner/group = %q/%q, want 54321/54322", e.Owner, e.Group)
	}
	if _, err := EntryInfo(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
}

func TestEntryMetadataFromXattrs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	writeFile(t, file, "")
	if err := unix.Setxattr(file, "user.e2b.owner", []byte("alice"), 0); err != nil {
		t.Skipf("no user xattrs here: %v", err)
	}
	// Past a small fixed read buffer where the filesystem allows (ext4 caps
	// all of a file's xattrs at one block).
	big := strings.Repeat("v", 6000)
	if err := unix.Setxattr(file, "user.e2b.big", []byte(big), 0); err != nil {
		big = strings.Repeat("v", 2000)
		must(t, unix.Setxattr(file, "user.e2b.big", []byte(big), 0))
	}
	must(t, unix.Setxattr(file, "user.other", []byte("ignored"), 0))
	e, err := EntryInfo(file)
	must(t, err)
	if len(e.Metadata) != 2 || e.Metadata["owner"] != "alice" || e.Metadata["big"] != big {
		t.Errorf("metadata = %v", e.Metadata)
	}
	plain := filepath.Join(dir, "plain")
	writeFile(t, plain, "")
	if e, _ := EntryInfo(plain); e.Metadata != nil {
		t.Errorf("plain file metadata = %v", e.Metadata)
	}
}

// TestStatWireJSON checks the JSON the SDK actually parses, byte for byte
// where the contract is specific (§5.1, §5.6).
func TestStatWireJSON(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	body, _ := json.Marshal(map[string]string{"path": dir})
	r, err := http.NewRequest("POST", env.srv.URL+"/filesystem.Filesystem/Stat", bytes.NewReader(body))
	must(t, err)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Connect-Protocol-Version", "1")
	resp, err := env.srv.Client().Do(r)
	must(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("status %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	var got struct {
		Entry map[string]any `json:"entry"`
	}
	must(t, json.Unmarshal(raw, &got))
	e := got.Entry
	if e["type"] != "FILE_TYPE_DIRECTORY" || e["mode"] != float64(0o755) || e["permissions"] != "drwxr-xr-x" ||
		e["path"] != dir || e["owner"] != "root" {
		t.Errorf("entry JSON = %s", raw)
	}
	if _, ok := e["size"].(string); !ok {
		t.Errorf("size is not an int64 string: %s", raw)
	}
	if _, ok := e["modifiedTime"].(string); !ok {
		t.Errorf("modifiedTime missing or not RFC 3339: %s", raw)
	}

	// Errors carry the code as a string in the body (the SDK reads it there).
	body, _ = json.Marshal(map[string]string{"path": filepath.Join(dir, "nope")})
	r, _ = http.NewRequest("POST", env.srv.URL+"/filesystem.Filesystem/Stat", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	resp, err = env.srv.Client().Do(r)
	must(t, err)
	defer resp.Body.Close()
	raw, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || !strings.Contains(string(raw), `"code":"not_found"`) {
		t.Errorf("missing: %d %s", resp.StatusCode, raw)
	}
}
