package filesystem

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/settings"
	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
	"github.com/warren-sandbox/warren/proto/envd/filesystem/filesystemconnect"
)

// streamTimeout bounds every watch stream a test opens.
const streamTimeout = 10 * time.Second

// testEnv is the service served over loopback HTTP, as envd serves it.
type testEnv struct {
	svc *Service
	srv *httptest.Server
	c   filesystemconnect.FilesystemClient
}

// newTestEnv serves a fresh service (default user root) and returns a client
// speaking the JSON codec, as the E2B SDK does.
func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	svc := NewService(settings.New("root", "", ""))
	path, h := filesystemconnect.NewFilesystemHandler(svc)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { srv.Close(); svc.Close() })
	return &testEnv{svc: svc, srv: srv, c: filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, connect.WithProtoJSON())}
}

// req wraps msg in a request, as user when user is not "".
func req[T any](msg *T, user string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if user != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	return r
}

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Errorf("%s: got %v, want %v", what, err, code)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// watchStream is an open WatchDir stream whose start frame was received.
type watchStream struct {
	t *testing.T
	s *connect.ServerStreamForClient[pb.WatchDirResponse]
	// keepalives counts keepalive frames seen so far.
	keepalives int
}

func openWatch(t *testing.T, c filesystemconnect.FilesystemClient, r *connect.Request[pb.WatchDirRequest]) *watchStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
	s, err := c.WatchDir(ctx, r)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.Close() })
	if !s.Receive() {
		t.Fatalf("stream ended before start: %v", s.Err())
	}
	if s.Msg().GetStart() == nil {
		t.Fatalf("first frame is %v, want start", s.Msg())
	}
	return &watchStream{t: t, s: s}
}

// until receives events until one named name of type typ arrives and
// returns all events received, that one included. The stream's timeout
// bounds the wait.
func (w *watchStream) until(name string, typ pb.EventType) []*pb.FilesystemEvent {
	w.t.Helper()
	var got []*pb.FilesystemEvent
	for w.s.Receive() {
		if w.s.Msg().GetKeepalive() != nil {
			w.keepalives++
			continue
		}
		ev := w.s.Msg().GetFilesystem()
		if ev == nil {
			w.t.Fatalf("unexpected frame %v", w.s.Msg())
		}
		got = append(got, ev)
		if ev.Name == name && ev.Type == typ {
			return got
		}
	}
	w.t.Fatalf("stream ended before %v %s (err %v); got %v", typ, name, w.s.Err(), got)
	return nil
}

// sentinel creates a file at the top of dir and waits for its CREATE: since
// events arrive in order, everything caused before it has arrived too.
func (w *watchStream) sentinel(dir string) []*pb.FilesystemEvent {
	w.t.Helper()
	name := "sentinel-" + strings.ReplaceAll(time.Now().Format("150405.000000000"), ".", "")
	writeFile(w.t, filepath.Join(dir, name), "")
	evs := w.until(name, pb.EventType_EVENT_TYPE_CREATE)
	return evs[:len(evs)-1]
}

func count(evs []*pb.FilesystemEvent, name string, typ pb.EventType) int {
	n := 0
	for _, e := range evs {
		if e.Name == name && e.Type == typ {
			n++
		}
	}
	return n
}

// inotifyFDs counts this process's open inotify instances: every watcher
// holds exactly one, so the count shows leaked watchers precisely.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, de := range des {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", de.Name())); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// settledGoroutines is runtime.NumGoroutine once it stops falling (idle
// connections and finished handlers wind down asynchronously).
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for range 25 {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m >= n {
			return m
		}
		n = m
	}
	return n
}

// Short names for the codes the tests check most.
const (
	connectNotFound        = connect.CodeNotFound
	connectInvalidArgument = connect.CodeInvalidArgument
	connectUnauthenticated = connect.CodeUnauthenticated
)
