package filesystem

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/settings"
	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
	"github.com/warren-sandbox/warren/proto/envd/filesystem/filesystemconnect"
)

// newTestService serves the filesystem service over loopback and returns a
// client that speaks the JSON codec, as the E2B SDK does.
func newTestService(t *testing.T) (*Service, filesystemconnect.FilesystemClient) {
	t.Helper()
	svc := NewService(settings.New("root", "", ""))
	path, h := filesystemconnect.NewFilesystemHandler(svc)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { srv.Close(); svc.Close() })
	return svc, filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, connect.WithProtoJSON())
}

func asUser[T any](msg *T, user string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	return req
}

func TestStatEntryFields(t *testing.T) {
	_, c := newTestService(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(file, []byte("abc"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Stat(context.Background(), connect.NewRequest(&pb.StatRequest{Path: file}))
	if err != nil {
		t.Fatal(err)
	}
	e := res.Msg.Entry
	if e.Name != "a.txt" || e.Path != file || e.Size != 3 || e.Type != pb.FileType_FILE_TYPE_FILE ||
		e.Mode != 0o640 || e.Permissions != "-rw-r-----" || e.Owner != "root" || e.Group != "root" || e.ModifiedTime == nil {
		t.Errorf("file entry = %v", e)
	}
	res, err = c.Stat(context.Background(), connect.NewRequest(&pb.StatRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	if d := res.Msg.Entry; d.Type != pb.FileType_FILE_TYPE_DIRECTORY || d.Mode&(1<<31) == 0 || d.Permissions[0] != 'd' {
		t.Errorf("dir entry = %v", d)
	}
	res, err = c.Stat(context.Background(), connect.NewRequest(&pb.StatRequest{Path: filepath.Join(dir, "link")}))
	if err != nil {
		t.Fatal(err)
	}
	if l := res.Msg.Entry; l.Type != pb.FileType_FILE_TYPE_SYMLINK || l.GetSymlinkTarget() != file {
		t.Errorf("symlink entry = %v", l)
	}
	_, err = c.Stat(context.Background(), connect.NewRequest(&pb.StatRequest{Path: filepath.Join(dir, "missing")}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("missing: %v, want not_found", err)
	}
	_, err = c.Stat(context.Background(), asUser(&pb.StatRequest{Path: dir}, "no-such-user-xyz"))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("unknown user: %v, want unauthenticated", err)
	}
}

func TestMakeDirOwnershipAndErrors(t *testing.T) {
	_, c := newTestService(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "x", "y")
	res, err := c.MakeDir(context.Background(), asUser(&pb.MakeDirRequest{Path: target}, "nobody"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.Entry.Path != target || res.Msg.Entry.Owner != "nobody" {
		t.Errorf("entry = %v", res.Msg.Entry)
	}
	for _, p := range []string{filepath.Join(dir, "x"), target} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
			t.Errorf("%s owned by uid %d, want nobody", p, uid)
		}
	}
	_, err = c.MakeDir(context.Background(), connect.NewRequest(&pb.MakeDirRequest{Path: target}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("existing dir: %v, want already_exists", err)
	}
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o644)
	_, err = c.MakeDir(context.Background(), connect.NewRequest(&pb.MakeDirRequest{Path: file}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("over a file: %v, want invalid_argument", err)
	}
}

func TestRelativePathsResolveAgainstHome(t *testing.T) {
	_, c := newTestService(t)
	name := "warren-fs-test-" + filepath.Base(t.TempDir())
	t.Cleanup(func() { os.RemoveAll(filepath.Join("/root", name)) })
	res, err := c.MakeDir(context.Background(), connect.NewRequest(&pb.MakeDirRequest{Path: name}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.Entry.Path != filepath.Join("/root", name) {
		t.Errorf("relative path resolved to %q", res.Msg.Entry.Path)
	}
	if _, err := c.Stat(context.Background(), connect.NewRequest(&pb.StatRequest{Path: "~/" + name})); err != nil {
		t.Errorf("~ path: %v", err)
	}
}

func TestMoveAndRemove(t *testing.T) {
	_, c := newTestService(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.txt")
	os.WriteFile(src, []byte("x"), 0o644)
	dst := filepath.Join(dir, "new", "dir", "dst.txt")
	res, err := c.Move(context.Background(), connect.NewRequest(&pb.MoveRequest{Source: src, Destination: dst}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.Entry.Path != dst || res.Msg.Entry.Name != "dst.txt" {
		t.Errorf("entry = %v", res.Msg.Entry)
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Error("source still exists")
	}
	_, err = c.Move(context.Background(), connect.NewRequest(&pb.MoveRequest{Source: src, Destination: dst}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("missing source: %v, want not_found", err)
	}
	if _, err := c.Remove(context.Background(), connect.NewRequest(&pb.RemoveRequest{Path: filepath.Join(dir, "new")})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !os.IsNotExist(err) {
		t.Error("directory not removed recursively")
	}
	_, err = c.Remove(context.Background(), connect.NewRequest(&pb.RemoveRequest{Path: filepath.Join(dir, "new")}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("missing: %v, want not_found", err)
	}
}

func TestListDirDepth(t *testing.T) {
	_, c := newTestService(t)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a", "b", "c"), 0o755)
	os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "a", "g"), nil, 0o644)
	os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "ln"))
	list := func(depth uint32) []string {
		res, err := c.ListDir(context.Background(), connect.NewRequest(&pb.ListDirRequest{Path: dir, Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range res.Msg.Entries {
			rel, _ := filepath.Rel(dir, e.Path)
			got = append(got, rel)
		}
		sort.Strings(got)
		return got
	}
	if got := list(0); !equal(got, []string{"a", "f", "ln"}) {
		t.Errorf("depth 0 → %v", got)
	}
	if got := list(2); !equal(got, []string{"a", "a/b", "a/g", "f", "ln"}) {
		t.Errorf("depth 2 → %v", got)
	}
	if got := list(10); !equal(got, []string{"a", "a/b", "a/b/c", "a/g", "f", "ln"}) {
		t.Errorf("depth 10 → %v", got)
	}
	_, err := c.ListDir(context.Background(), connect.NewRequest(&pb.ListDirRequest{Path: filepath.Join(dir, "f")}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("file: %v, want invalid_argument", err)
	}
	_, err = c.ListDir(context.Background(), connect.NewRequest(&pb.ListDirRequest{Path: filepath.Join(dir, "nope")}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("missing: %v, want not_found", err)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// watchEvents opens a WatchDir stream, runs act once it has started, and
// collects events until want of them arrived or the bound elapsed.
func watchEvents(t *testing.T, c filesystemconnect.FilesystemClient, req *pb.WatchDirRequest, act func(), want int) []*pb.FilesystemEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	stream, err := c.WatchDir(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first message is not start: %v", stream.Err())
	}
	act()
	var got []*pb.FilesystemEvent
	for len(got) < want && stream.Receive() {
		if ev := stream.Msg().GetFilesystem(); ev != nil {
			got = append(got, ev)
		}
	}
	return got
}

func hasEvent(evs []*pb.FilesystemEvent, name string, typ pb.EventType) bool {
	for _, e := range evs {
		if e.Name == name && e.Type == typ {
			return true
		}
	}
	return false
}

func TestWatchDirNonRecursive(t *testing.T) {
	_, c := newTestService(t)
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	evs := watchEvents(t, c, &pb.WatchDirRequest{Path: dir, IncludeEntry: true}, func() {
		os.WriteFile(filepath.Join(dir, "sub", "deep.txt"), []byte("x"), 0o644)
		os.WriteFile(filepath.Join(dir, "top.txt"), []byte("x"), 0o644)
	}, 1)
	if !hasEvent(evs, "top.txt", pb.EventType_EVENT_TYPE_CREATE) {
		t.Errorf("no create event for top.txt: %v", evs)
	}
	if hasEvent(evs, "sub/deep.txt", pb.EventType_EVENT_TYPE_CREATE) {
		t.Errorf("non-recursive watch reported a nested file: %v", evs)
	}
	if evs[0].Entry == nil || evs[0].Entry.Name != "top.txt" {
		t.Errorf("includeEntry: entry = %v", evs[0].Entry)
	}
}

func TestWatchDirRecursive(t *testing.T) {
	_, c := newTestService(t)
	dir := t.TempDir()
	evs := watchEvents(t, c, &pb.WatchDirRequest{Path: dir, Recursive: true}, func() {
		os.Mkdir(filepath.Join(dir, "new"), 0o755)
		time.Sleep(100 * time.Millisecond) // let the watcher add the new directory
		os.WriteFile(filepath.Join(dir, "new", "f.txt"), []byte("x"), 0o644)
		os.Rename(filepath.Join(dir, "new", "f.txt"), filepath.Join(dir, "new", "g.txt"))
		os.Remove(filepath.Join(dir, "new", "g.txt"))
	}, 6)
	for _, want := range []struct {
		name string
		typ  pb.EventType
	}{
		{"new", pb.EventType_EVENT_TYPE_CREATE},
		{"new/f.txt", pb.EventType_EVENT_TYPE_CREATE},
		{"new/f.txt", pb.EventType_EVENT_TYPE_WRITE},
		{"new/f.txt", pb.EventType_EVENT_TYPE_RENAME},
		{"new/g.txt", pb.EventType_EVENT_TYPE_REMOVE},
	} {
		if !hasEvent(evs, want.name, want.typ) {
			t.Errorf("missing %v %s in %v", want.typ, want.name, evs)
		}
	}
}

func TestWatchDirErrorsAndKeepalive(t *testing.T) {
	_, c := newTestService(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o644)
	for path, code := range map[string]connect.Code{file: connect.CodeInvalidArgument, filepath.Join(dir, "nope"): connect.CodeNotFound} {
		stream, err := c.WatchDir(context.Background(), connect.NewRequest(&pb.WatchDirRequest{Path: path}))
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
		}
		if connect.CodeOf(err) != code {
			t.Errorf("watch %s: %v, want %v", path, err, code)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req := connect.NewRequest(&pb.WatchDirRequest{Path: dir})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	stream, err := c.WatchDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	stream.Receive() // start
	if !stream.Receive() || stream.Msg().GetKeepalive() == nil {
		t.Errorf("no keepalive: %v %v", stream.Msg(), stream.Err())
	}
}

func TestPolledWatcher(t *testing.T) {
	svc, c := newTestService(t)
	dir := t.TempDir()
	res, err := c.CreateWatcher(context.Background(), connect.NewRequest(&pb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.WatcherId
	os.WriteFile(filepath.Join(dir, "a"), nil, 0o644)
	var evs []*pb.FilesystemEvent
	for deadline := time.Now().Add(3 * time.Second); len(evs) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := c.GetWatcherEvents(context.Background(), connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, got.Msg.Events...)
	}
	if !hasEvent(evs, "a", pb.EventType_EVENT_TYPE_CREATE) {
		t.Errorf("events %v", evs)
	}
	if _, err := c.RemoveWatcher(context.Background(), connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetWatcherEvents(context.Background(), connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("removed watcher: %v, want not_found", err)
	}
	_, err = c.RemoveWatcher(context.Background(), connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("second remove: %v, want not_found", err)
	}
	svc.mu.Lock()
	n := len(svc.watchers)
	svc.mu.Unlock()
	if n != 0 {
		t.Errorf("%d watchers left", n)
	}
}

func TestCancelledWatchLeaksNothing(t *testing.T) {
	_, c := newTestService(t)
	dir := t.TempDir()
	// Warm up connections and lazily started goroutines.
	watchEvents(t, c, &pb.WatchDirRequest{Path: dir}, func() {}, 0)
	before := runtime.NumGoroutine()
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := c.WatchDir(ctx, connect.NewRequest(&pb.WatchDirRequest{Path: dir, Recursive: true}))
		if err != nil {
			t.Fatal(err)
		}
		stream.Receive()
		cancel()
		stream.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+3 {
		t.Errorf("goroutines: %d before, %d after 20 cancelled watches", before, n)
	}
}
