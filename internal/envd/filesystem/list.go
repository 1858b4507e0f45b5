package filesystem

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

// maxListEntries bounds one ListDir answer: a deep listing of / would
// otherwise build a response of unbounded size in memory.
const maxListEntries = 1 << 20

// ListDir lists a directory down to depth levels (0 means 1). The directory
// itself may be a symlink to a directory; nothing below it is followed.
// Entries carry absolute paths under the path as requested, parents before
// their children.
func (s *Service) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	_, root, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(min(req.Msg.GetDepth(), 1<<16))
	if depth == 0 {
		depth = 1
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err, "cannot list '%s'", root)
	}
	if !fi.IsDir() {
		return nil, invalidArgument("path '%s' is not a directory", root)
	}
	l := lister{ctx: ctx}
	if err := l.list(root, depth, true); err != nil {
		return nil, fsError(err, "cannot list '%s'", root)
	}
	return connect.NewResponse(&pb.ListDirResponse{Entries: l.entries}), nil
}

type lister struct {
	ctx     context.Context
	entries []*pb.EntryInfo
}

// list appends dir's entries and, depth permitting, their children's.
// Below the top, unreadable or vanished directories are skipped rather than
// failing the listing: they are still listed themselves.
func (l *lister) list(dir string, depth int, top bool) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		if !top && (errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist)) {
			return nil
		}
		return err
	}
	for _, de := range des {
		if err := l.ctx.Err(); err != nil {
			return connect.NewError(connect.CodeCanceled, err)
		}
		if len(l.entries) >= maxListEntries {
			return connect.NewError(connect.CodeResourceExhausted, errors.New("too many entries; list with a smaller depth"))
		}
		path := filepath.Join(dir, de.Name())
		fi, err := de.Info() // lstat: symlinks stay symlinks
		if err != nil {
			continue // removed while listing
		}
		l.entries = append(l.entries, entryFromInfo(path, fi))
		if depth > 1 && fi.IsDir() {
			if err := l.list(path, depth-1, false); err != nil {
				return err
			}
		}
	}
	return nil
}
