// Package filesystem implements E2B's filesystem.Filesystem Connect service:
// stat, list, make, move and remove entries, and watch directories either as
// a stream (WatchDir) or through polled watchers (CreateWatcher,
// GetWatcherEvents, RemoveWatcher).
//
// Paths are resolved for the request's user (Basic Authorization header, else
// the sandbox's default user): "~" and relative paths are taken from that
// user's home, and directories the service creates belong to that user.
package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/rpc"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/internal/envd/users"
	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
	"github.com/warren-sandbox/warren/proto/envd/filesystem/filesystemconnect"
)

// Service implements filesystemconnect.FilesystemHandler.
type Service struct {
	settings *settings.Settings

	mu       sync.Mutex
	watchers map[string]*pollWatcher
	closed   bool
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// NewService returns the filesystem service.
func NewService(s *settings.Settings) *Service {
	return &Service{settings: s, watchers: map[string]*pollWatcher{}}
}

// Close stops every polled watcher. Streaming watchers end with their streams.
func (s *Service) Close() {
	s.mu.Lock()
	ws := s.watchers
	s.watchers = map[string]*pollWatcher{}
	s.closed = true
	s.mu.Unlock()
	for _, w := range ws {
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

// fsError maps a filesystem error to the Connect code the SDK expects.
func fsError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	code := connect.CodeInternal
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, fs.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ENOTEMPTY):
		code = connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC):
		code = connect.CodeResourceExhausted
	}
	return connect.NewError(code, fmt.Errorf("%s: %w", msg, err))
}

// Stat describes one entry.
func (s *Service) Stat(_ context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := EntryInfo(path)
	if err != nil {
		return nil, fsError(err, "stat '%s'", path)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its missing parents, owned by the user.
func (s *Service) MakeDir(_ context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	u, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory '%s' already exists", path))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' already exists and is not a directory", path))
	}
	if err := u.MkdirAll(path, 0o755); err != nil {
		return nil, fsError(err, "creating directory '%s'", path)
	}
	e, err := EntryInfo(path)
	if err != nil {
		return nil, fsError(err, "stat '%s'", path)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating the destination's parents.
func (s *Service) Move(_ context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	u, src, err := s.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst := u.ResolvePath(req.Msg.GetDestination(), s.settings.DefaultWorkdir())
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(err, "source '%s'", src)
	}
	if err := u.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, fsError(err, "creating parent of '%s'", dst)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(err, "moving '%s' to '%s'", src, dst)
	}
	e, err := EntryInfo(dst)
	if err != nil {
		return nil, fsError(err, "stat '%s'", dst)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

// Remove deletes an entry, directories recursively.
func (s *Service) Remove(_ context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err != nil {
		return nil, fsError(err, "removing '%s'", path)
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, fsError(err, "removing '%s'", path)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// ListDir lists a directory up to depth levels down (0 means 1), without
// following symlinks.
func (s *Service) ListDir(_ context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	_, root, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	// A symlink to a directory may be listed: only entries below are not followed.
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err, "listing '%s'", root)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", root))
	}
	var entries []*pb.EntryInfo
	if err := listInto(&entries, root, depth); err != nil {
		return nil, fsError(err, "listing '%s'", root)
	}
	return connect.NewResponse(&pb.ListDirResponse{Entries: entries}), nil
}

func listInto(out *[]*pb.EntryInfo, dir string, depth int) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		path := filepath.Join(dir, de.Name())
		fi, err := de.Info()
		if err != nil {
			continue // removed while listing
		}
		*out = append(*out, entryFromInfo(path, fi))
		if depth > 1 && fi.IsDir() {
			if err := listInto(out, path, depth-1); err != nil && !errors.Is(err, fs.ErrPermission) && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}
