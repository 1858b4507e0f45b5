// Package reaper waits for every child process of envd in one place.
//
// envd is PID 1 of its sandbox (or a child subreaper in development), so
// orphaned grandchildren are re-parented to it and must be reaped, or they
// linger as zombies. A single wait4(-1) loop reaps them all; processes envd
// started itself are registered, and their exit status is handed to the
// registrant instead of being dropped. Nothing else in envd may call wait.
package reaper

import (
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reaper reaps children. Create it with Start before starting any process.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	sigs    chan os.Signal
	done    chan struct{}
}

// Start makes the calling process a child subreaper (a no-op when it is PID
// 1) and begins reaping on SIGCHLD.
func Start() (*Reaper, error) {
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, err
		}
	}
	r := &Reaper{
		waiters: map[int]chan syscall.WaitStatus{},
		sigs:    make(chan os.Signal, 16),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	go r.loop()
	return r, nil
}

// Stop ends the reaping loop.
func (r *Reaper) Stop() {
	signal.Stop(r.sigs)
	close(r.done)
}

// StartCmd starts cmd and returns its pid and a channel that receives its
// wait status exactly once. cmd must not use Go-managed I/O copying
// (Stdin/Stdout/Stderr must be nil or *os.File), because Wait is never
// called on it; cmd.Process is released and must not be used afterwards.
func (r *Reaper) StartCmd(cmd *exec.Cmd) (int, <-chan syscall.WaitStatus, error) {
	// Holding the lock across fork means the loop cannot reap this child
	// before it is registered.
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	pid := cmd.Process.Pid
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	// Drop Go's pidfd/handle (this also sets Process.Pid to -1); the loop
	// below does the waiting.
	_ = cmd.Process.Release()
	return pid, ch, nil
}

func (r *Reaper) loop() {
	for {
		select {
		case <-r.done:
			return
		case <-r.sigs:
			r.reapAll()
		}
	}
}

func (r *Reaper) reapAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ws.Stopped() || ws.Continued() {
			continue
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws
		}
	}
}
