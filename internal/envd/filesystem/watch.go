package filesystem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/envd/rpc"
	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

// maxPolledEvents bounds the events a polled watcher buffers between two
// GetWatcherEvents calls; older events are dropped first.
const maxPolledEvents = 10000

// networkFS are statfs magic numbers of network and FUSE filesystems, where
// inotify misses remote changes; watching them needs allow_network_mounts.
var networkFS = map[int64]string{
	0x6969:     "nfs",
	0x517b:     "smb",
	0xff534d42: "cifs",
	0xfe534d42: "smb2",
	0x65735546: "fuse",
}

// watcher turns fsnotify events below root into E2B filesystem events.
type watcher struct {
	root         string
	recursive    bool
	includeEntry bool
	fsw          *fsnotify.Watcher
	events       chan *pb.FilesystemEvent
	stop         chan struct{}
	stopOnce     sync.Once
	done         chan struct{}
}

// watchParams are the fields shared by WatchDirRequest and CreateWatcherRequest.
type watchParams struct {
	path                    string
	recursive, includeEntry bool
	allowNetworkMounts      bool
}

func newWatcher(root string, p watchParams) (*watcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err, "watching '%s'", root)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", root))
	}
	if !p.allowNetworkMounts {
		var st unix.Statfs_t
		if unix.Statfs(root, &st) == nil {
			if name, ok := networkFS[int64(st.Type)]; ok {
				return nil, connect.NewError(connect.CodeInvalidArgument,
					fmt.Errorf("'%s' is on a %s network mount; set allowNetworkMounts to watch it", root, name))
			}
		}
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("creating a watcher: %w", err))
	}
	w := &watcher{
		root: root, recursive: p.recursive, includeEntry: p.includeEntry, fsw: fsw,
		events: make(chan *pb.FilesystemEvent, 256), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if err := w.add(root); err != nil {
		fsw.Close()
		return nil, fsError(err, "watching '%s'", root)
	}
	go w.run()
	return w, nil
}

// add watches dir and, when recursive, every directory below it.
func (w *watcher) add(dir string) error {
	if !w.recursive {
		return w.fsw.Add(dir)
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir {
				return err
			}
			return nil // a subdirectory vanished or is unreadable: skip it
		}
		if d.IsDir() {
			if err := w.fsw.Add(path); err != nil && path == dir {
				return err
			}
		}
		return nil
	})
}

func (w *watcher) close() {
	w.stopOnce.Do(func() {
		close(w.stop)
		w.fsw.Close()
	})
	<-w.done
}

func (w *watcher) run() {
	defer close(w.done)
	defer close(w.events)
	for {
		select {
		case <-w.stop:
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if w.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					_ = w.add(ev.Name)
				}
			}
			for _, out := range w.convert(ev) {
				select {
				case w.events <- out:
				case <-w.stop:
					return
				}
			}
		case _, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			// Overflow and similar: events were lost; keep watching.
		}
	}
}

var opTypes = []struct {
	op fsnotify.Op
	t  pb.EventType
}{
	{fsnotify.Create, pb.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Write, pb.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, pb.EventType_EVENT_TYPE_REMOVE},
	{fsnotify.Rename, pb.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, pb.EventType_EVENT_TYPE_CHMOD},
}

// convert makes one E2B event per operation in ev, named relative to root.
func (w *watcher) convert(ev fsnotify.Event) []*pb.FilesystemEvent {
	name, err := filepath.Rel(w.root, ev.Name)
	if err != nil || name == "." {
		return nil // the watched directory itself
	}
	var out []*pb.FilesystemEvent
	for _, ot := range opTypes {
		if !ev.Has(ot.op) {
			continue
		}
		e := &pb.FilesystemEvent{Name: name, Type: ot.t}
		if w.includeEntry && ot.t != pb.EventType_EVENT_TYPE_REMOVE && ot.t != pb.EventType_EVENT_TYPE_RENAME {
			if info, err := EntryInfo(ev.Name); err == nil {
				e.Entry = info
			}
		}
		out = append(out, e)
	}
	return out
}

// WatchDir streams events below a directory: start first, then events and
// keepalives, until the client leaves or the stream's timeout elapses.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	_, root, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := newWatcher(root, watchParams{
		recursive: req.Msg.GetRecursive(), includeEntry: req.Msg.GetIncludeEntry(),
		allowNetworkMounts: req.Msg.GetAllowNetworkMounts(),
	})
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keepalive := rpc.KeepaliveInterval(req.Header())
	ticker := time.NewTicker(keepalive)
	defer ticker.Stop()
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				return connect.NewError(connect.CodeInternal, errors.New("watcher stopped"))
			}
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
			ticker.Reset(keepalive)
		case <-ticker.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("watch timeout elapsed"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

// pollWatcher buffers a watcher's events for GetWatcherEvents.
type pollWatcher struct {
	w      *watcher
	mu     sync.Mutex
	buf    []*pb.FilesystemEvent
	closed chan struct{}
}

func newPollWatcher(w *watcher) *pollWatcher {
	p := &pollWatcher{w: w, closed: make(chan struct{})}
	go func() {
		for ev := range w.events {
			p.mu.Lock()
			if len(p.buf) >= maxPolledEvents {
				p.buf = p.buf[1:]
			}
			p.buf = append(p.buf, ev)
			p.mu.Unlock()
		}
		close(p.closed)
	}()
	return p
}

func (p *pollWatcher) drain() []*pb.FilesystemEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.buf
	p.buf = nil
	return out
}

func (p *pollWatcher) close() {
	p.w.close()
	<-p.closed
}

// CreateWatcher starts a watcher whose events are collected by polling.
func (s *Service) CreateWatcher(_ context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	_, root, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := newWatcher(root, watchParams{
		recursive: req.Msg.GetRecursive(), includeEntry: req.Msg.GetIncludeEntry(),
		allowNetworkMounts: req.Msg.GetAllowNetworkMounts(),
	})
	if err != nil {
		return nil, err
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	pw := newPollWatcher(w)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		pw.close()
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("envd is shutting down"))
	}
	s.watchers[id] = pw
	s.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *Service) watcher(id string) (*pollWatcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pw, ok := s.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher '%s' not found", id))
	}
	return pw, nil
}

// GetWatcherEvents returns and clears the events collected since the last call.
func (s *Service) GetWatcherEvents(_ context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	pw, err := s.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: pw.drain()}), nil
}

// RemoveWatcher stops a polled watcher.
func (s *Service) RemoveWatcher(_ context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	s.mu.Lock()
	pw, ok := s.watchers[req.Msg.GetWatcherId()]
	delete(s.watchers, req.Msg.GetWatcherId())
	s.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher '%s' not found", req.Msg.GetWatcherId()))
	}
	pw.close()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
