package seckit

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
)

// Proc is a process a suite runs (a `warren serve`), killed with the
// test process (Pdeathsig).
//
// Pdeathsig fires when the thread that forked the child ends, not the
// test process: Go ends a thread whose goroutine exits locked to it, as
// the helpers that enter a network namespace do, and a server started
// from such a thread was killed mid-suite. So the process is started and
// waited for by a goroutine locked to its thread for as long as it lives.
type Proc struct {
	Cmd *exec.Cmd
	// Exited is closed once the process has exited.
	Exited chan struct{}
}

// StartProc starts cmd with its output in log, which also gets a line
// with the exit status when it ends (so that a server that died
// mid-suite, by a signal or the OOM killer, says how).
func StartProc(cmd *exec.Cmd, log *os.File, name string) (*Proc, error) {
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &Proc{Cmd: cmd, Exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		fmt.Fprintf(log, "\n[harness] %s (pid %d) exited: %v\n", name, cmd.Process.Pid, cmd.ProcessState)
		close(p.Exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// WaitHealthy polls url every interval, for up to 90 s, until it answers
// 200 or the process exits.
func (p *Proc) WaitHealthy(url string, interval time.Duration) (healthy, exited bool) {
	poll.Within(90*time.Second, interval, func() bool {
		select {
		case <-p.Exited:
			exited = true
			return true
		default:
		}
		if res, err := http.Get(url); err == nil {
			res.Body.Close()
			healthy = res.StatusCode == http.StatusOK
		}
		return healthy
	})
	return healthy, exited
}

// ErrStopTimeout is Stop's error for a process that outlived its SIGTERM
// by 20 s (it was then killed).
var ErrStopTimeout = errors.New("did not stop within 20s of SIGTERM")

// Stop ends the process with SIGTERM, SIGKILL after 20 s.
func (p *Proc) Stop() error {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.Exited:
		return nil
	case <-time.After(20 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.Exited
		return ErrStopTimeout
	}
}
