// Package filesystem implements E2B's filesystem.Filesystem Connect service:
// stat, list, make, move and remove entries, and watch directories either as
// a stream (WatchDir) or through polled watchers (CreateWatcher,
// GetWatcherEvents, RemoveWatcher).
//
// Paths are resolved for the request's user (Basic Authorization header, else
// the sandbox's default user): "~" and relative paths are taken from that
// user's home, and directories the service creates belong to that user.
// envd runs as root, so access itself is not checked per user, as in E2B.
//
// EntryInfo is exported for other envd packages that describe files the same
// way (uploads).
package filesystem

import (
	"errors"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/rpc"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/internal/envd/users"
	"github.com/warren-sandbox/warren/proto/envd/filesystem/filesystemconnect"
)

// Service implements filesystemconnect.FilesystemHandler.
type Service struct {
	settings *settings.Settings

	mu       sync.Mutex
	polled   map[string]*pollWatcher // by watcher id
	streamed map[*watcher]struct{}   // watchers of open WatchDir streams
	closed   bool
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// errShuttingDown ends watches when envd stops; unavailable is what the SDK
// reports as the sandbox going away.
var errShuttingDown = connect.NewError(connect.CodeUnavailable, errors.New("envd is shutting down"))

// NewService returns the filesystem service.
func NewService(s *settings.Settings) *Service {
	return &Service{settings: s, polled: map[string]*pollWatcher{}, streamed: map[*watcher]struct{}{}}
}

// Close stops every watcher, polled and streamed (open WatchDir streams end
// with unavailable), and refuses new ones. It returns once their goroutines,
// inotify descriptors and watches are gone.
func (s *Service) Close() {
	s.mu.Lock()
	polled, streamed := s.polled, s.streamed
	s.polled, s.streamed = map[string]*pollWatcher{}, map[*watcher]struct{}{}
	s.closed = true
	s.mu.Unlock()
	for _, p := range polled {
		p.close()
	}
	for w := range streamed {
		w.close()
	}
}

// resolve returns the request's user and path resolved for that user.
func (s *Service) resolve(h http.Header, path string) (*users.User, string, error) {
	u, err := rpc.User(h, s.settings)
	if err != nil {
		return nil, "", err
	}
	return u, u.ResolvePath(path, s.settings.DefaultWorkdir()), nil
}
