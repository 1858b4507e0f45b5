package filesystem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"connectrpc.com/connect"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

// maxPolledEvents bounds the events a polled watcher keeps between two
// GetWatcherEvents calls: a client that stops polling must not grow envd
// without limit. The oldest events are dropped first.
const maxPolledEvents = 10000

// pollWatcher collects a watcher's events until GetWatcherEvents takes them.
type pollWatcher struct {
	w       *watcher
	mu      sync.Mutex
	buf     []*pb.FilesystemEvent
	drained chan struct{} // closed when the collecting goroutine ends
}

func newPollWatcher(w *watcher) *pollWatcher {
	p := &pollWatcher{w: w, drained: make(chan struct{})}
	go p.collect()
	return p
}

func (p *pollWatcher) collect() {
	defer close(p.drained)
	for ev := range p.w.events {
		p.mu.Lock()
		if len(p.buf) >= maxPolledEvents {
			p.buf = p.buf[1:]
		}
		p.buf = append(p.buf, ev)
		p.mu.Unlock()
	}
}

// take returns and clears the collected events.
func (p *pollWatcher) take() []*pb.FilesystemEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.buf
	p.buf = nil
	return out
}

func (p *pollWatcher) close() {
	p.w.close()
	<-p.drained
}

// CreateWatcher starts a watcher whose events are fetched by polling
// (E2B's Python sync SDK). It lives until RemoveWatcher or envd's shutdown,
// not bound to this request.
func (s *Service) CreateWatcher(_ context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	_, root, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := newWatcher(root, watchParams{
		recursive:          req.Msg.GetRecursive(),
		includeEntry:       req.Msg.GetIncludeEntry(),
		allowNetworkMounts: req.Msg.GetAllowNetworkMounts(),
	})
	if err != nil {
		return nil, err
	}
	p := newPollWatcher(w)
	id := newWatcherID()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		p.close()
		return nil, errShuttingDown
	}
	s.polled[id] = p
	s.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func newWatcherID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return "w" + hex.EncodeToString(b[:])
}

// GetWatcherEvents returns and clears the events collected since the last call.
func (s *Service) GetWatcherEvents(_ context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	s.mu.Lock()
	p, ok := s.polled[req.Msg.GetWatcherId()]
	s.mu.Unlock()
	if !ok {
		return nil, watcherNotFound(req.Msg.GetWatcherId())
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: p.take()}), nil
}

// RemoveWatcher stops a polled watcher; its uncollected events are dropped.
func (s *Service) RemoveWatcher(_ context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	s.mu.Lock()
	p, ok := s.polled[req.Msg.GetWatcherId()]
	delete(s.polled, req.Msg.GetWatcherId())
	s.mu.Unlock()
	if !ok {
		return nil, watcherNotFound(req.Msg.GetWatcherId())
	}
	p.close()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

func watcherNotFound(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher '%s' not found", id))
}
