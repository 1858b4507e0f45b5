package filesystem

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

const (
	evCreate = pb.EventType_EVENT_TYPE_CREATE
	evWrite  = pb.EventType_EVENT_TYPE_WRITE
	evRemove = pb.EventType_EVENT_TYPE_REMOVE
	evRename = pb.EventType_EVENT_TYPE_RENAME
	evChmod  = pb.EventType_EVENT_TYPE_CHMOD
)

func TestWatchDirNonRecursive(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	w := openWatch(t, env.c, req(&pb.WatchDirRequest{Path: dir, IncludeEntry: true}, ""))

	writeFile(t, filepath.Join(dir, "sub", "deep.txt"), "x") // not watched
	top := filepath.Join(dir, "top.txt")
	writeFile(t, top, "abc")
	evs := w.until("top.txt", evCreate)
	for _, e := range evs {
		if strings.HasPrefix(e.Name, "sub/") {
			t.Errorf("non-recursive watch reported a nested entry: %v", e)
		}
	}
	if e := evs[len(evs)-1].Entry; e == nil || e.Name != "top.txt" || e.Path != top || e.Type != pb.FileType_FILE_TYPE_FILE {
		t.Errorf("create entry = %v", e)
	}
	if e := w.until("top.txt", evWrite)[0].Entry; e == nil || e.Path != top {
		t.Errorf("write entry = %v", e)
	}
	must(t, os.Chmod(top, 0o600))
	if e := w.until("top.txt", evChmod)[0].Entry; e == nil || e.Permissions != "-rw-------" {
		t.Errorf("chmod entry = %v", e)
	}
	must(t, os.Rename(top, filepath.Join(dir, "renamed.txt")))
	w.until("top.txt", evRename)
	w.until("renamed.txt", evCreate)
	must(t, os.Remove(filepath.Join(dir, "renamed.txt")))
	if e := w.until("renamed.txt", evRemove)[0]; e.Entry != nil {
		t.Errorf("remove carries an entry: %v", e.Entry)
	}
	// The watched directory's own changes are named ".".
	must(t, os.Chmod(dir, 0o750))
	w.until(".", evChmod)
	for _, e := range w.sentinel(dir) {
		if strings.HasPrefix(e.Name, "sub/") {
			t.Errorf("non-recursive watch reported a nested entry: %v", e)
		}
	}
}

func TestWatchDirWithoutIncludeEntry(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	w := openWatch(t, env.c, req(&pb.WatchDirRequest{Path: dir}, ""))
	writeFile(t, filepath.Join(dir, "f"), "")
	if e := w.until("f", evCreate)[0]; e.Entry != nil {
		t.Errorf("entry sent without includeEntry: %v", e.Entry)
	}
}

func TestWatchDirRecursive(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "old", "inner"), 0o755))
	// Watching through a symlink works and names stay relative.
	link := filepath.Join(t.TempDir(), "link")
	must(t, os.Symlink(dir, link))
	w := openWatch(t, env.c, req(&pb.WatchDirRequest{Path: link, Recursive: true}, ""))

	writeFile(t, filepath.Join(dir, "old", "inner", "x"), "")
	w.until("old/inner/x", evCreate)

	must(t, os.Mkdir(filepath.Join(dir, "new"), 0o755))
	w.until("new", evCreate)
	// Once the CREATE of a directory arrived, the directory is watched.
	f := filepath.Join(dir, "new", "f.txt")
	writeFile(t, f, "x")
	w.until("new/f.txt", evWrite)
	must(t, os.Rename(f, filepath.Join(dir, "new", "g.txt")))
	w.until("new/f.txt", evRename)
	w.until("new/g.txt", evCreate)
	must(t, os.Remove(filepath.Join(dir, "new", "g.txt")))
	w.until("new/g.txt", evRemove)
	must(t, os.Remove(filepath.Join(dir, "new")))
	w.until("new", evRemove)
}

// TestWatchDirRecursiveMkdirP covers entries that appear before their
// parent has a watch: each must still be reported, and exactly once.
func TestWatchDirRecursiveMkdirP(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	w := openWatch(t, env.c, req(&pb.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}, ""))
	must(t, os.MkdirAll(filepath.Join(dir, "p", "q", "r"), 0o755))
	writeFile(t, filepath.Join(dir, "p", "q", "r", "f"), "x")
	evs := w.sentinel(dir)
	for _, name := range []string{"p", "p/q", "p/q/r", "p/q/r/f"} {
		if n := count(evs, name, evCreate); n != 1 {
			t.Errorf("%d CREATE events for %s, want 1: %v", n, name, evs)
		}
	}
	for _, e := range evs {
		if e.Type == evCreate && (e.Entry == nil || e.Entry.Path != filepath.Join(dir, e.Name)) {
			t.Errorf("create without its entry: %v", e)
		}
	}
	// The deepest directory is watched too.
	writeFile(t, filepath.Join(dir, "p", "q", "r", "later"), "")
	w.until("p/q/r/later", evCreate)

	// A tree moved in was never seen being built: its content is announced.
	outside := filepath.Join(t.TempDir(), "tree")
	must(t, os.MkdirAll(filepath.Join(outside, "s"), 0o755))
	writeFile(t, filepath.Join(outside, "s", "g"), "")
	must(t, os.Rename(outside, filepath.Join(dir, "tree")))
	evs = w.sentinel(dir)
	for _, name := range []string{"tree", "tree/s", "tree/s/g"} {
		if n := count(evs, name, evCreate); n != 1 {
			t.Errorf("%d CREATE events for %s, want 1: %v", n, name, evs)
		}
	}
	writeFile(t, filepath.Join(dir, "tree", "s", "later"), "")
	w.until("tree/s/later", evCreate)
}

// TestWatchDirRecursiveMovedDirectories checks that a directory moved
// inside the tree reports under its new name, one moved out stops
// reporting, and a change to a watched subdirectory is reported once
// although inotify tells both its watch and its parent's.
func TestWatchDirRecursiveMovedDirectories(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "a", "sub"), 0o755))
	w := openWatch(t, env.c, req(&pb.WatchDirRequest{Path: dir, Recursive: true}, ""))

	must(t, os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")))
	evs := w.until("b", evCreate)
	writeFile(t, filepath.Join(dir, "b", "sub", "f"), "")
	evs = append(evs, w.until("b/sub/f", evCreate)...)
	evs = append(evs, w.sentinel(dir)...)
	if n := count(evs, "a", evRename); n != 1 {
		t.Errorf("%d RENAME events for a, want 1: %v", n, evs)
	}
	for _, e := range evs {
		if strings.HasPrefix(e.Name, "a/") {
			t.Errorf("event under the old name: %v", e)
		}
	}

	must(t, os.Chmod(filepath.Join(dir, "b", "sub"), 0o700))
	evs = w.sentinel(dir)
	if n := count(evs, "b/sub", evChmod); n != 1 {
		t.Errorf("%d CHMOD events for b/sub, want 1: %v", n, evs)
	}

	outside := filepath.Join(t.TempDir(), "gone")
	must(t, os.Rename(filepath.Join(dir, "b"), outside))
	writeFile(t, filepath.Join(outside, "sub", "after"), "")
	evs = w.sentinel(dir)
	if n := count(evs, "b", evRename); n != 1 {
		t.Errorf("%d RENAME events for b, want 1: %v", n, evs)
	}
	for _, e := range evs {
		if strings.Contains(e.Name, "after") {
			t.Errorf("a directory moved out still reports: %v", e)
		}
	}
}

func TestWatchDirKeepalive(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	r := req(&pb.WatchDirRequest{Path: dir}, "")
	r.Header().Set("Keepalive-Ping-Interval", "1")
	w := openWatch(t, env.c, r)
	start := time.Now()
	if !w.s.Receive() || w.s.Msg().GetKeepalive() == nil {
		t.Fatalf("want a keepalive, got %v (err %v)", w.s.Msg(), w.s.Err())
	}
	if d := time.Since(start); d < 500*time.Millisecond || d > 3*time.Second {
		t.Errorf("keepalive after %v, want about 1s", d)
	}
	// Events still flow between keepalives.
	writeFile(t, filepath.Join(dir, "f"), "")
	w.until("f", evCreate)
}

func TestWatchDirErrors(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	writeFile(t, file, "")
	streamErr := func(r *connect.Request[pb.WatchDirRequest]) error {
		ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
		defer cancel()
		s, err := env.c.WatchDir(ctx, r)
		if err != nil {
			return err
		}
		defer s.Close()
		for s.Receive() {
			if s.Msg().GetStart() != nil {
				return nil
			}
		}
		return s.Err()
	}
	wantCode(t, "file", streamErr(req(&pb.WatchDirRequest{Path: file}, "")), connect.CodeInvalidArgument)
	wantCode(t, "missing", streamErr(req(&pb.WatchDirRequest{Path: filepath.Join(dir, "nope")}, "")), connect.CodeNotFound)
	wantCode(t, "unknown user", streamErr(req(&pb.WatchDirRequest{Path: dir}, "no-such-user-xyz")), connect.CodeUnauthenticated)

	// Pretend dir is on NFS.
	real := statfsType
	t.Cleanup(func() { statfsType = real })
	statfsType = func(string) (uint32, error) { return 0x6969, nil }
	err := streamErr(req(&pb.WatchDirRequest{Path: dir}, ""))
	wantCode(t, "nfs", err, connect.CodeInvalidArgument)
	if err == nil || !strings.Contains(err.Error(), "nfs") {
		t.Errorf("nfs message: %v", err)
	}
	if err := streamErr(req(&pb.WatchDirRequest{Path: dir, AllowNetworkMounts: true}, "")); err != nil {
		t.Errorf("allowed network mount: %v", err)
	}
	_, err = env.c.CreateWatcher(context.Background(), req(&pb.CreateWatcherRequest{Path: dir}, ""))
	wantCode(t, "polled on nfs", err, connect.CodeInvalidArgument)
}

// TestWatchDirWire speaks the Connect streaming protocol by hand, as the
// SDK's fetch transport does: HTTP 200, a start frame, and a timeout reported
// as deadline_exceeded in the end-of-stream frame (§5.1, §5.2).
func TestWatchDirWire(t *testing.T) {
	env := newTestEnv(t)
	body, _ := json.Marshal(map[string]any{"path": t.TempDir(), "recursive": true})
	var env0 bytes.Buffer
	env0.WriteByte(0)
	binary.Write(&env0, binary.BigEndian, uint32(len(body)))
	env0.Write(body)
	r, err := http.NewRequest("POST", env.srv.URL+"/filesystem.Filesystem/WatchDir", &env0)
	must(t, err)
	r.Header.Set("Content-Type", "application/connect+json")
	r.Header.Set("Connect-Protocol-Version", "1")
	r.Header.Set("Connect-Timeout-Ms", "300")
	client := &http.Client{Timeout: streamTimeout}
	resp, err := client.Do(r)
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var frames []string
	var end []byte
	for end == nil {
		var hdr [5]byte
		if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
			t.Fatalf("after %v: %v", frames, err)
		}
		msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(resp.Body, msg); err != nil {
			t.Fatal(err)
		}
		if hdr[0] == 2 {
			end = msg
		} else {
			frames = append(frames, string(msg))
		}
	}
	if len(frames) == 0 || frames[0] != `{"start":{}}` {
		t.Errorf("frames %q, want start first", frames)
	}
	var es struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(end, &es); err != nil || es.Error.Code != "deadline_exceeded" {
		t.Errorf("end of stream %s, want deadline_exceeded", end)
	}
}
