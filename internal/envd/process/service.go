// Package process implements E2B's process.Process Connect service: it
// starts processes (with pipes or a PTY) as the requested user, streams their
// output to every attached client, and lets clients attach, send input,
// resize, signal and list them.
//
// A process belongs to the sandbox, not to the stream that started it: a
// client that disconnects leaves the process running (only its
// Connect-Timeout-Ms, when given, bounds the process's life), and any client
// can attach to it later with Connect.
package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/reaper"
	"github.com/warren-sandbox/warren/internal/envd/rpc"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// exitedRetention is how long an exited process can still be attached to
// with Connect, which then replays its start and end events.
const exitedRetention = 30 * time.Second

// Service implements processconnect.ProcessHandler.
type Service struct {
	settings *settings.Settings
	reaper   *reaper.Reaper
	log      *slog.Logger // set by SetLogger; discards by default

	mu      sync.Mutex
	running map[uint32]*proc
	exited  map[uint32]*proc
}

var _ processconnect.ProcessHandler = (*Service)(nil)

// NewService returns the process service. r reaps every process it starts.
func NewService(s *settings.Settings, r *reaper.Reaper) *Service {
	return &Service{
		settings: s,
		reaper:   r,
		log:      slog.New(slog.DiscardHandler),
		running:  map[uint32]*proc{},
		exited:   map[uint32]*proc{},
	}
}

// SetLogger makes the service log each process's start, end and (bounded)
// output to l; nil turns that off again. Call it before serving requests:
// processes already started keep the logger they were started with.
func (s *Service) SetLogger(l *slog.Logger) {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	s.log = l
}

func (s *Service) add(p *proc) {
	s.mu.Lock()
	s.running[p.pid] = p
	s.mu.Unlock()
}

// remove moves p from the running set to the recently exited set.
func (s *Service) remove(p *proc) {
	s.mu.Lock()
	delete(s.running, p.pid)
	s.exited[p.pid] = p
	s.mu.Unlock()
	time.AfterFunc(exitedRetention, func() {
		s.mu.Lock()
		if s.exited[p.pid] == p {
			delete(s.exited, p.pid)
		}
		s.mu.Unlock()
	})
}

// find resolves a selector among running processes, or, with exited set,
// also among recently exited ones.
func (s *Service) find(sel *pb.ProcessSelector, exited bool) (*proc, error) {
	if sel == nil || sel.GetSelector() == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a process selector (pid or tag) is required"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sets := []map[uint32]*proc{s.running}
	if exited {
		sets = append(sets, s.exited)
	}
	for _, set := range sets {
		switch v := sel.GetSelector().(type) {
		case *pb.ProcessSelector_Pid:
			if p, ok := set[v.Pid]; ok {
				return p, nil
			}
		case *pb.ProcessSelector_Tag:
			for _, p := range set {
				if p.tag != nil && *p.tag == v.Tag {
					return p, nil
				}
			}
		}
	}
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	default:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", sel.GetTag()))
	}
}

// Start runs a process and streams its events: start{pid}, output, end.
func (s *Service) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	t0 := time.Now()
	u, err := rpc.User(req.Header(), s.settings)
	if err != nil {
		return err
	}
	userLookup := time.Since(t0)
	var lifetime time.Duration
	if dl, ok := ctx.Deadline(); ok {
		if lifetime = time.Until(dl); lifetime <= 0 {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("timeout elapsed before the process started"))
		}
	}
	p, sub, err := s.launch(req.Msg, u, lifetime, userLookup)
	if err != nil {
		return err
	}
	return follow(ctx, p, sub, rpc.KeepaliveInterval(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

// Connect attaches to a running (or just exited) process.
func (s *Service) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess(), true)
	if err != nil {
		return err
	}
	return follow(ctx, p, p.subscribe(), rpc.KeepaliveInterval(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// follow sends start{pid}, then p's events (as received by sub) until its end event, with a
// keepalive whenever the stream has been quiet for the keepalive interval.
// Leaving early (client gone, stream deadline) detaches without touching
// the process.
func follow(ctx context.Context, p *proc, sub *subscriber, keepalive time.Duration, send func(*pb.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	ticker := time.NewTicker(keepalive)
	defer ticker.Stop()
	for {
		select {
		case <-sub.ready:
			for {
				ev, ok, lagged := sub.next()
				if lagged {
					return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
						"this stream fell more than %d MiB behind the process's output and was cut off; the process keeps running (attach again with Connect)", maxLag>>20))
				}
				if !ok {
					break
				}
				if _, isEnd := ev.Event.(*pb.ProcessEvent_End); isEnd && p.timedOut.Load() {
					return connect.NewError(connect.CodeDeadlineExceeded, errors.New("process killed: its timeout elapsed"))
				}
				if err := send(ev); err != nil {
					return err
				}
				if _, isEnd := ev.Event.(*pb.ProcessEvent_End); isEnd {
					return nil
				}
			}
			ticker.Reset(keepalive)
		case <-ticker.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("stream timeout elapsed"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

// List returns the running processes.
func (s *Service) List(context.Context, *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &pb.ListResponse{Processes: make([]*pb.ProcessInfo, 0, len(s.running))}
	for _, p := range s.running {
		out.Processes = append(out.Processes, &pb.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
	}
	return connect.NewResponse(out), nil
}

// Update resizes a process's PTY.
func (s *Service) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		if err := p.resize(req.Msg.GetPty().GetSize()); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// SendInput writes to a process's stdin or PTY.
func (s *Service) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if err := s.input(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// StreamInput takes a start{process} message, then input data messages.
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := s.find(ev.Start.GetProcess(), false)
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the first message must be start with the process selector"))
			}
			if err := s.input(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (s *Service) input(p *proc, in *pb.ProcessInput) error {
	var err error
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		err = p.writeStdin(v.Stdin)
	case *pb.ProcessInput_Pty:
		err = p.writePTY(v.Pty)
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input must be stdin or pty data"))
	}
	if err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return nil
}

// SendSignal sends SIGTERM or SIGKILL to a process and its process group.
func (s *Service) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	if err := p.signal(sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", p.pid))
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// CloseStdin closes a process's stdin pipe, so it reads EOF.
func (s *Service) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// SignalAll sends sig to every running process; envd forwards the signals
// it receives as PID 1 this way.
func (s *Service) SignalAll(sig syscall.Signal) {
	s.mu.Lock()
	procs := make([]*proc, 0, len(s.running))
	for _, p := range s.running {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		_ = p.signal(sig)
	}
}
