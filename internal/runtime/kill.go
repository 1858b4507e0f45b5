package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// pidWatch is a pidfd on a process we are about to kill: opened before the
// signal so that the PID cannot be reused under us, and pollable for the
// process's exit without a sleep loop. The processes runtimes start are
// not our children (they are re-parented once the runtime's CLI exits), so
// wait(2) is not an option.
type pidWatch struct{ fd int }

// watchPid opens a pidfd; ok is false when the process is already gone.
func watchPid(pid int) (w pidWatch, ok bool, err error) {
	if pid <= 0 {
		return pidWatch{-1}, false, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return pidWatch{-1}, false, nil
	}
	if err != nil {
		return pidWatch{-1}, false, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	return pidWatch{fd}, true, nil
}

func (w pidWatch) close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
	}
}

func (w pidWatch) kill() error {
	err := unix.PidfdSendSignal(w.fd, unix.SIGKILL, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// wait blocks until the process has exited (a zombie counts) or ctx ends.
func (w pidWatch) wait(ctx context.Context) error {
	for {
		timeout := 100 // ms; re-check ctx this often
		if d, ok := ctx.Deadline(); ok {
			timeout = max(0, min(timeout, int(time.Until(d).Milliseconds())))
		}
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, timeout)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("poll pidfd: %w", err)
		}
		if n > 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// killAndWait SIGKILLs pid and waits for it to exit, bounded by ctx.
func killAndWait(ctx context.Context, pid int) error {
	w, ok, err := watchPid(pid)
	if err != nil || !ok {
		return err
	}
	defer w.close()
	if err := w.kill(); err != nil {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	if err := w.wait(ctx); err != nil {
		return fmt.Errorf("waiting for %d to exit: %w", pid, err)
	}
	return nil
}

// processAlive is true for a live process: not gone and not a zombie.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain ") ".
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return true
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}
