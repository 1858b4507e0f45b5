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
// every attached stream (the Start stream and any Connect streams).
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

// subscriber receives the events of one proc in order. A slow subscriber
// slows the readers down (like a pipe would); a gone one is skipped.
type subscriber struct {
	events chan *pb.ProcessEvent
	gone   chan struct{}
}

func (p *proc) subscribe() *subscriber {
	s := &subscriber{events: make(chan *pb.ProcessEvent, 64), gone: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		s.events <- p.end
		return s
	}
	p.subs[s] = struct{}{}
	return s
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// broadcast delivers ev to every subscriber attached now.
func (p *proc) broadcast(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
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
