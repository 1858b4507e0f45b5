package filesystem

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/poll"
	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

func TestPolledWatcherLifecycle(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	base := inotifyFDs(t)
	res, err := env.c.CreateWatcher(context.Background(), req(&pb.CreateWatcherRequest{Path: dir, Recursive: true, IncludeEntry: true}, ""))
	must(t, err)
	id := res.Msg.WatcherId
	if id == "" || inotifyFDs(t) != base+1 {
		t.Fatalf("id %q, inotify instances %d (base %d)", id, inotifyFDs(t), base)
	}
	get := func() []*pb.FilesystemEvent {
		t.Helper()
		r, err := env.c.GetWatcherEvents(context.Background(), req(&pb.GetWatcherEventsRequest{WatcherId: id}, ""))
		must(t, err)
		return r.Msg.Events
	}

	must(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
	writeFile(t, filepath.Join(dir, "d", "a"), "x")
	var evs []*pb.FilesystemEvent
	if !poll.Within(5*time.Second, 20*time.Millisecond, func() bool {
		evs = append(evs, get()...)
		return count(evs, "d/a", evCreate) > 0
	}) {
		t.Fatalf("no CREATE for d/a in %v", evs)
	}
	if count(evs, "d", evCreate) != 1 || count(evs, "d/a", evCreate) != 1 {
		t.Errorf("events %v", evs)
	}
	for _, e := range evs {
		if e.Type == evCreate && e.Entry == nil {
			t.Errorf("includeEntry ignored: %v", e)
		}
	}
	// Taken events are gone.
	if again := get(); count(again, "d", evCreate)+count(again, "d/a", evCreate) != 0 {
		t.Errorf("events returned twice: %v", again)
	}

	_, err = env.c.RemoveWatcher(context.Background(), req(&pb.RemoveWatcherRequest{WatcherId: id}, ""))
	must(t, err)
	if n := inotifyFDs(t); n != base {
		t.Errorf("inotify instances %d after remove, want %d", n, base)
	}
	_, err = env.c.GetWatcherEvents(context.Background(), req(&pb.GetWatcherEventsRequest{WatcherId: id}, ""))
	wantCode(t, "get after remove", err, connect.CodeNotFound)
	_, err = env.c.RemoveWatcher(context.Background(), req(&pb.RemoveWatcherRequest{WatcherId: id}, ""))
	wantCode(t, "second remove", err, connect.CodeNotFound)
	_, err = env.c.RemoveWatcher(context.Background(), req(&pb.RemoveWatcherRequest{}, ""))
	wantCode(t, "empty id", err, connect.CodeNotFound)
}

func TestPolledWatcherErrors(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	writeFile(t, file, "")
	base := inotifyFDs(t)
	_, err := env.c.CreateWatcher(context.Background(), req(&pb.CreateWatcherRequest{Path: filepath.Join(dir, "nope")}, ""))
	wantCode(t, "missing", err, connect.CodeNotFound)
	_, err = env.c.CreateWatcher(context.Background(), req(&pb.CreateWatcherRequest{Path: file}, ""))
	wantCode(t, "file", err, connect.CodeInvalidArgument)
	if n := inotifyFDs(t); n != base {
		t.Errorf("failed creates left %d inotify instances", n-base)
	}
}

func TestPolledBufferIsBounded(t *testing.T) {
	ch := make(chan *pb.FilesystemEvent)
	p := newPollWatcher(&watcher{events: ch})
	total := maxPolledEvents + 7
	for i := range total {
		ch <- &pb.FilesystemEvent{Name: fmt.Sprint(i)}
	}
	close(ch)
	select {
	case <-p.drained:
	case <-time.After(5 * time.Second):
		t.Fatal("collector did not end")
	}
	got := p.take()
	if len(got) != maxPolledEvents || got[0].Name != "7" || got[len(got)-1].Name != fmt.Sprint(total-1) {
		t.Errorf("kept %d events, first %s: want the newest %d", len(got), got[0].Name, maxPolledEvents)
	}
}

// TestCloseStopsEveryWatcher: Close ends open streams with unavailable,
// stops polled watchers, releases their inotify instances and refuses new
// watches.
func TestCloseStopsEveryWatcher(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	base := inotifyFDs(t)
	w := openWatch(t, env.c, req(&pb.WatchDirRequest{Path: dir, Recursive: true}, ""))
	res, err := env.c.CreateWatcher(context.Background(), req(&pb.CreateWatcherRequest{Path: dir}, ""))
	must(t, err)
	if n := inotifyFDs(t); n != base+2 {
		t.Fatalf("%d inotify instances, want %d", n, base+2)
	}

	env.svc.Close()
	if n := inotifyFDs(t); n != base {
		t.Errorf("%d inotify instances after Close, want %d", n, base)
	}
	for w.s.Receive() {
	}
	wantCode(t, "stream after Close", w.s.Err(), connect.CodeUnavailable)
	_, err = env.c.GetWatcherEvents(context.Background(), req(&pb.GetWatcherEventsRequest{WatcherId: res.Msg.WatcherId}, ""))
	wantCode(t, "polled after Close", err, connect.CodeNotFound)
	_, err = env.c.CreateWatcher(context.Background(), req(&pb.CreateWatcherRequest{Path: dir}, ""))
	wantCode(t, "create after Close", err, connect.CodeUnavailable)
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
	defer cancel()
	s, err := env.c.WatchDir(ctx, req(&pb.WatchDirRequest{Path: dir}, ""))
	must(t, err)
	for s.Receive() {
	}
	wantCode(t, "watch after Close", s.Err(), connect.CodeUnavailable)
	if n := inotifyFDs(t); n != base {
		t.Errorf("%d inotify instances after refused watches, want %d", n, base)
	}
	env.svc.Close() // twice is fine
}

// TestCancelledWatchLeaksNothing: clients that vanish mid-stream leave no
// goroutine, inotify instance or descriptor behind.
func TestCancelledWatchLeaksNothing(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755))
	// Warm up: the first request starts connection and runtime goroutines.
	openWatch(t, env.c, req(&pb.WatchDirRequest{Path: dir}, "")).s.Close()
	env.srv.CloseClientConnections()
	goroutines, inotify := settledGoroutines(), inotifyFDs(t)

	const n = 20
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := env.c.WatchDir(ctx, req(&pb.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}, ""))
		must(t, err)
		if !s.Receive() {
			t.Fatalf("stream %d: %v", i, s.Err())
		}
		writeFile(t, filepath.Join(dir, "a", "b", fmt.Sprint(i)), "x") // events in flight
		cancel()
		s.Close()
	}
	if !poll.Within(5*time.Second, 20*time.Millisecond, func() bool { return inotifyFDs(t) == inotify }) {
		t.Errorf("inotify instances: %d before, %d after %d cancelled watches", inotify, inotifyFDs(t), n)
	}
	env.srv.CloseClientConnections()
	var now int
	if !poll.Within(5*time.Second, 20*time.Millisecond, func() bool { now = settledGoroutines(); return now <= goroutines+2 }) {
		t.Errorf("goroutines: %d before, %d after %d cancelled watches", goroutines, now, n)
	}
}
