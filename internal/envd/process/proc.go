package process

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"

	pb "github.com/warren-sandbox/warren/proto/envd/process"
)

// drainGrace bounds how long output is still read after a process has
// exited. Data already in the pipe is read at once; the grace only matters
// when a background grandchild inherited the pipe and keeps it open, which
// would otherwise hold the command's result back forever.
const drainGrace = 250 * time.Millisecond

// proc is one process started through Start: its output is fanned out to
// every attached stream (the Start stream and any Connect streams). The
// process never waits for a stream: see maxLag.
type proc struct {
	pid    uint32
	tag    *string
	config *pb.ProcessConfig

	stdinMu sync.Mutex
	stdin   *os.File // write end of the stdin pipe; nil when stdin is /dev/null or closed
	pty     *os.File // PTY master; nil without a PTY

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *pb.ProcessEvent // set once the process has ended and its output is drained

	done chan struct{} // closed after end is set

	timedOut atomic.Bool // killed because its Connect-Timeout-Ms elapsed
}

// maxLag bounds the output bytes a subscriber may have queued: a client
// that falls further behind the process is dropped (its stream ends with
// resource_exhausted) rather than slowing the process or its other
// clients. Every chunk is shared by all subscribers, so the memory all
// queues hold together stays near maxLag too. A variable for tests.
var maxLag = 32 << 20

// subscriber receives the events of one proc in order through an
// unbounded-looking but maxLag-bounded queue: pushing never blocks, so
// the pumps keep draining the process's pipes whatever the clients do.
type subscriber struct {
	mu     sync.Mutex
	queue  []*pb.ProcessEvent
	queued int  // output bytes in queue
	lagged bool // fell more than maxLag behind and was dropped
	// ready has a value whenever the queue may have gained an event or
	// lagged was set since the subscriber last looked.
	ready chan struct{}
}

func newSubscriber() *subscriber {
	return &subscriber{ready: make(chan struct{}, 1)}
}

// push queues ev, which carries size bytes of output; the end event is
// always queued. It reports false, and empties the queue, when the
// subscriber would lag more than maxLag behind.
func (s *subscriber) push(ev *pb.ProcessEvent, size int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lagged {
		return false
	}
	if size > 0 && s.queued+size > maxLag {
		s.lagged = true
		s.queue, s.queued = nil, 0
	} else {
		s.queue = append(s.queue, ev)
		s.queued += size
	}
	select {
	case s.ready <- struct{}{}:
	default:
	}
	return !s.lagged
}

// next pops the oldest queued event; ok is false when the queue is empty.
// lagged reports that the subscriber was dropped: no more events come.
func (s *subscriber) next() (ev *pb.ProcessEvent, ok, lagged bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lagged || len(s.queue) == 0 {
		return nil, false, s.lagged
	}
	ev = s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	s.queued -= outputSize(ev)
	return ev, true, false
}

// outputSize is what an event counts against maxLag: its output bytes.
func outputSize(ev *pb.ProcessEvent) int {
	d := ev.GetData()
	return len(d.GetStdout()) + len(d.GetStderr()) + len(d.GetPty())
}

func (p *proc) subscribe() *subscriber {
	s := newSubscriber()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		s.push(p.end, 0)
		return s
	}
	p.subs[s] = struct{}{}
	return s
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// broadcast queues ev for every subscriber attached now and drops those
// that fell too far behind. It never blocks on a subscriber; holding the
// lock across the pushes keeps stdout and stderr in one order for all.
func (p *proc) broadcast(ev *pb.ProcessEvent) {
	size := outputSize(ev)
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		if !s.push(ev, size) {
			delete(p.subs, s)
		}
	}
}

// finish records the end event and hands it to every subscriber; later
// subscribers get it replayed by subscribe.
func (p *proc) finish(end *pb.ProcessEvent) {
	p.broadcast(end)
	p.mu.Lock()
	p.end = end
	p.subs = nil
	p.mu.Unlock()
	close(p.done)
}

// signal sends sig to the process's whole process group, so children of a
// shell die with it.
func (p *proc) signal(sig syscall.Signal) error {
	if p.pid <= 1 || p.pid > math.MaxInt32 {
		// Never let a bad pid turn into kill(-1) or a signal to init.
		return fmt.Errorf("refusing to signal pid %d", p.pid)
	}
	err := syscall.Kill(-int(p.pid), sig)
	if errors.Is(err, syscall.ESRCH) {
		// Not a group leader after all (should not happen): try the pid.
		err = syscall.Kill(int(p.pid), sig)
	}
	return err
}

func (p *proc) writeStdin(data []byte) error {
	if p.pty != nil {
		return errors.New("process has a PTY: send input as pty input")
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return errors.New("stdin of the process is closed or was not requested")
	}
	_, err := p.stdin.Write(data)
	return err
}

func (p *proc) writePTY(data []byte) error {
	if p.pty == nil {
		return errors.New("process has no PTY: send input as stdin")
	}
	_, err := p.pty.Write(data)
	return err
}

func (p *proc) closeStdin() error {
	if p.pty != nil {
		return errors.New("cannot close stdin of a PTY process")
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

func (p *proc) resize(size *pb.PTY_Size) error {
	if p.pty == nil {
		return errors.New("process has no PTY")
	}
	if size == nil || size.GetCols() == 0 || size.GetRows() == 0 {
		return errors.New("pty size needs cols and rows greater than 0")
	}
	return pty.Setsize(p.pty, &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())})
}

// output names which DataEvent field a reader fills.
type output int

const (
	outStdout output = iota
	outStderr
	outPTY
)

func dataEvent(kind output, b []byte) *pb.ProcessEvent {
	d := &pb.ProcessEvent_DataEvent{}
	switch kind {
	case outStdout:
		d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}
	case outStderr:
		d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}
	default:
		d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: b}
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}
}

// pump reads r until EOF (or the post-exit deadline), broadcasts chunks and
// copies their lines, bounded, to envd's log.
func (p *proc) pump(r *os.File, kind output, log *slog.Logger, wg *sync.WaitGroup) {
	defer wg.Done()
	out := newOutputLog(log, p.pid, kind)
	defer out.flush()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			chunk := make([]byte, n)
			copy(chunk, buf[:n])
			p.broadcast(dataEvent(kind, chunk))
			// After the broadcast, so clients never wait for the log.
			out.write(chunk)
		}
		if err != nil {
			// EOF, EIO (PTY slave closed) or the drain deadline: all end the stream.
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, syscall.EIO) {
				p.broadcast(dataEvent(outStderr, fmt.Appendf(nil, "envd: reading process output: %v\n", err)))
				log.Warn("reading process output failed", "pid", p.pid, "stream", out.stream, "err", err)
			}
			return
		}
	}
}

// endEvent turns a wait status into E2B's end event: exit code (-1 when
// killed by a signal), whether it exited normally, Go's status wording, and
// an error text for anything but a clean exit.
func endEvent(ws syscall.WaitStatus) *pb.ProcessEvent {
	end := &pb.ProcessEvent_EndEvent{}
	switch {
	case ws.Exited():
		end.Exited = true
		end.ExitCode = int32(ws.ExitStatus())
		end.Status = fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		end.ExitCode = -1
		end.Status = "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			end.Status += " (core dumped)"
		}
	default:
		end.ExitCode = -1
		end.Status = fmt.Sprintf("unknown wait status %#x", uint32(ws))
	}
	if end.ExitCode != 0 {
		msg := end.Status
		end.Error = &msg
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
}
