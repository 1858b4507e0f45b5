package codeinterp

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// kernel is one context's bridge process (bridge.py) and, through it, its
// Jupyter kernel. The bridge and the kernel share a process group, which
// kill ends.
type kernel struct {
	pid  int
	dir  string // the context's private directory (connection file, sockets)
	done <-chan struct{}

	inMu sync.Mutex
	in   *os.File // the bridge's stdin

	// sandboxEnv is the sandbox's environment as the kernel has it. A
	// kernel started before the platform set the sandbox's variables (a
	// warm sandbox, claimed later) gets them with its next execution.
	// Guarded by the context's turn.
	sandboxEnv map[string]string

	// events carries the bridge's lines after "ready", one JSON object
	// each; it is closed when the bridge's stdout ends (it exited).
	events chan []byte

	killOnce sync.Once
	stop     chan struct{} // closed by kill: read stops forwarding
	// restarted is set before a restart or removal kills the kernel, so
	// that the execution it cuts short says why.
	mu     sync.Mutex
	reason string
}

// startKernel starts a bridge for language in cwd and waits until its
// kernel answers (or fails, or startTimeout passes).
func (s *Server) startKernel(id, language, cwd string) (*kernel, error) {
	// A directory per kernel, not per context: a killed kernel's directory
	// is removed once it has exited, which may be after its successor
	// started.
	dir, err := os.MkdirTemp(s.runDir, "ctx-"+id[:8]+"-")
	if err != nil {
		return nil, fmt.Errorf("context directory: %w", err)
	}
	if u := s.cfg.User; u != nil {
		if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("context directory: %w", err)
		}
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(s.cfg.Python, s.bridgePath, language, cwd, dir, strconv.Itoa(s.cfg.MaxUserProcesses))
	cmd.Dir = "/"
	env, sandboxEnv := s.environ()
	cmd.Env = env
	cmd.Stdin = stdinR
	cmd.Stdout = stdoutW
	cmd.Stderr = nil // /dev/null: a tenant's kernel must not fill envd's log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if u := s.cfg.User; u != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	pid, done, err := s.cfg.Start(cmd)
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting the kernel: %w", err)
	}
	k := &kernel{pid: pid, dir: dir, done: done, in: stdinW, events: make(chan []byte, 16), stop: make(chan struct{}), sandboxEnv: sandboxEnv}
	ready := make(chan error, 1)
	go k.read(stdoutR, s.cfg.MaxLineBytes, ready)
	select {
	case err = <-ready:
	case <-time.After(s.cfg.StartTimeout):
		err = fmt.Errorf("the kernel did not start within %s", s.cfg.StartTimeout)
	}
	if err != nil {
		k.kill()
		return nil, err
	}
	return k, nil
}

// read forwards the bridge's lines to k.events; the first one answers
// ready. A line longer than max is replaced by an error event: the stream
// stays valid JSON lines whatever a cell prints.
func (k *kernel) read(out *os.File, max int, ready chan<- error) {
	defer out.Close()
	defer close(k.events)
	// The bridge's stdout ends when it exits: its kernel, now an orphan in
	// its group, goes with it, and the context gets a new pair.
	defer k.kill()
	r := bufio.NewReaderSize(out, 64<<10)
	first := true
	for {
		line, err := readLine(r, max)
		if errors.Is(err, errLineTooLong) {
			line, err = tooLongEvent(max), nil
		}
		if err != nil {
			if first {
				ready <- errors.New("the kernel's bridge exited before it was ready")
			}
			return
		}
		if first {
			first = false
			var hello struct{ Type, Message string }
			if json.Unmarshal(line, &hello) != nil || hello.Type != "ready" {
				if hello.Message == "" {
					hello.Message = "the kernel's bridge failed to start"
				}
				ready <- errors.New(hello.Message)
				return
			}
			ready <- nil
			continue
		}
		select {
		case k.events <- line:
		case <-k.stop:
			return
		}
	}
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line without its newline. A line longer than max is
// read to its end and dropped: errLineTooLong.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	long := false
	for {
		chunk, err := r.ReadSlice('\n')
		if !long {
			if len(line)+len(chunk) > max+1 {
				long, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			if err == io.EOF && len(line) > 0 && !long {
				return line, nil
			}
			return nil, err
		}
		if long {
			return nil, errLineTooLong
		}
		return line[:len(line)-1], nil
	}
}

func tooLongEvent(max int) []byte {
	b, _ := json.Marshal(map[string]string{
		"type": "stderr",
		"text": fmt.Sprintf("[warren: an output of this cell was larger than %d bytes and was dropped]\n", max),
	})
	return b
}

// send writes one op to the bridge.
func (k *kernel) send(op any) error {
	b, err := json.Marshal(op)
	if err != nil {
		return err
	}
	k.inMu.Lock()
	defer k.inMu.Unlock()
	_, err = k.in.Write(append(b, '\n'))
	return err
}

// sandboxEnvChanges returns the sandbox variables that are new or
// changed since the kernel last had them (nil if none) and records them.
func (k *kernel) sandboxEnvChanges(now map[string]string) map[string]string {
	var changed map[string]string
	for name, v := range now {
		if old, ok := k.sandboxEnv[name]; !ok || old != v {
			if changed == nil {
				changed = map[string]string{}
			}
			changed[name] = v
		}
	}
	if changed != nil {
		k.sandboxEnv = maps.Clone(now)
	}
	return changed
}

// interrupt asks the bridge to send SIGINT to the kernel.
func (k *kernel) interrupt() { _ = k.send(map[string]string{"op": "interrupt"}) }

// kill ends the bridge and its kernel (their process group) and removes
// the context's directory; reason, if not "", is what a running execution
// reports.
func (k *kernel) killWith(reason string) {
	k.mu.Lock()
	if k.reason == "" {
		k.reason = reason
	}
	k.mu.Unlock()
	k.kill()
}

func (k *kernel) kill() {
	k.killOnce.Do(func() {
		close(k.stop)
		_ = syscall.Kill(-k.pid, syscall.SIGKILL)
		k.inMu.Lock()
		k.in.Close()
		k.inMu.Unlock()
		go func() {
			<-k.done
			// Processes forked while the group was being killed (a fork
			// bomb) and orphans the bridge left behind stay in its group.
			k.waitGone(groupKillTimeout)
			_ = os.RemoveAll(k.dir)
		}()
	})
}

// groupKillTimeout bounds how long a kill keeps killing a kernel's group.
const groupKillTimeout = 10 * time.Second

// waitGone kills the kernel's process group until no process is left in
// it (orphans are reaped by envd, the sandbox's init) or timeout passes;
// it reports whether the group is gone. A fork bomb's processes fork
// while a kill goes through the group, so one kill is not enough; and
// until they are gone they count against the user's RLIMIT_NPROC, which
// the context's next kernel needs.
func (k *kernel) waitGone(timeout time.Duration) bool {
	return killGroup(k.pid, timeout)
}

func killGroup(pgid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		if err := syscall.Kill(-pgid, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
	}
}

// alive reports whether the bridge still runs.
func (k *kernel) alive() bool {
	select {
	case <-k.done:
		return false
	case <-k.stop:
		return false
	default:
		return true
	}
}

func (k *kernel) killReason() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reason
}
