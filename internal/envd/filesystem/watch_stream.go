package filesystem

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/rpc"
	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

// WatchDir streams the changes below a directory: a start frame as soon as
// the watch is in place (the SDK waits for it), then events, and keepalives
// whenever nothing was sent for the Keepalive-Ping-Interval. The stream runs
// until the client leaves, its Connect-Timeout-Ms elapses (deadline_exceeded)
// or envd shuts down (unavailable); the watch ends with it.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	_, root, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := newWatcher(root, watchParams{
		recursive:          req.Msg.GetRecursive(),
		includeEntry:       req.Msg.GetIncludeEntry(),
		allowNetworkMounts: req.Msg.GetAllowNetworkMounts(),
	})
	if err != nil {
		return err
	}
	defer w.close()
	if !s.trackStream(w) {
		return errShuttingDown
	}
	defer s.untrackStream(w)

	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	interval := rpc.KeepaliveInterval(req.Header())
	keepalive := time.NewTimer(interval)
	defer keepalive.Stop()
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				return errShuttingDown // only Close stops a streamed watcher
			}
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		case <-keepalive.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("watch timeout elapsed"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
		// Since Go 1.23 Reset discards a pending tick, so the next
		// keepalive is a full interval after whatever was just sent.
		keepalive.Reset(interval)
	}
}

// trackStream registers a streamed watcher so Close can end it; false once
// the service is closed.
func (s *Service) trackStream(w *watcher) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.streamed[w] = struct{}{}
	return true
}

func (s *Service) untrackStream(w *watcher) {
	s.mu.Lock()
	delete(s.streamed, w)
	s.mu.Unlock()
}
