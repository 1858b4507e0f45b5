package filesystem

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/users"
	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

// dirPerm is the mode of directories the service creates (E2B's too).
const dirPerm = 0o755

// Stat describes one entry; a final symlink is described, not followed.
func (s *Service) Stat(_ context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := EntryInfo(path)
	if err != nil {
		return nil, fsError(err, "cannot stat '%s'", path)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its missing parents, all owned by the
// request's user. An existing directory is already_exists (the SDK's
// makeDir then returns false); anything else in the way is invalid_argument.
func (s *Service) MakeDir(_ context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	u, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory '"+path+"' already exists"))
		}
		return nil, invalidArgument("path '%s' already exists and is not a directory", path)
	}
	// A dangling symlink is not followed by Stat, but mkdir would fail on it.
	if fi, err := os.Lstat(path); err == nil && !fi.IsDir() {
		return nil, invalidArgument("path '%s' already exists and is not a directory", path)
	}
	if err := makeDirs(u, path); err != nil {
		return nil, fsError(err, "cannot create directory '%s'", path)
	}
	e, err := EntryInfo(path)
	if err != nil {
		return nil, fsError(err, "cannot stat '%s'", path)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// makeDirs is users.MkdirAll with a classified error when some ancestor is
// not a directory (MkdirAll reports that case with an unclassified error).
func makeDirs(u *users.User, dir string) error {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return invalidArgument("'%s' is not a directory", p)
			}
			break
		}
		if parent := filepath.Dir(p); parent == p {
			break
		}
	}
	return u.MkdirAll(dir, dirPerm)
}

// Move renames source to destination, creating the destination's missing
// parents for the user, and returns the moved entry (the SDK requires it).
func (s *Service) Move(_ context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	if req.Msg.GetSource() == "" || req.Msg.GetDestination() == "" {
		// "" resolves to the workdir or home: never a sensible thing to move.
		return nil, invalidArgument("source and destination are required")
	}
	u, src, err := s.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst := u.ResolvePath(req.Msg.GetDestination(), s.settings.DefaultWorkdir())
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(err, "cannot move '%s'", src)
	}
	if err := makeDirs(u, filepath.Dir(dst)); err != nil {
		return nil, fsError(err, "cannot create the parent directory of '%s'", dst)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(err, "cannot move '%s' to '%s'", src, dst)
	}
	e, err := EntryInfo(dst)
	if err != nil {
		return nil, fsError(err, "cannot stat '%s'", dst)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

// Remove deletes an entry, a directory with everything in it. A symlink is
// removed itself, never its target. Removing what does not exist succeeds,
// as in E2B's envd (os.RemoveAll); only an empty path is refused, where
// E2B's would remove the working directory.
func (s *Service) Remove(_ context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	if req.Msg.GetPath() == "" {
		// "" resolves to the workdir or home: deleting that is never meant.
		return nil, invalidArgument("path is required")
	}
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fsError(err, "cannot remove '%s'", path)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}
