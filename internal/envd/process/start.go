package process

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	"github.com/warren-sandbox/warren/internal/envd/users"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
)

// defaultPath is PATH for processes whose environment sets none; a login
// shell (the SDK runs commands with bash -l) replaces it from /etc/profile.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// launch starts the process described by req as user u and returns it with
// its output pumps running, and a subscriber attached before the first byte
// of output. lifetime > 0 kills it (and its process group) when it elapses,
// whether or not a client is still attached.
func (s *Service) launch(req *pb.StartRequest, u *users.User, lifetime, userLookup time.Duration) (*proc, *subscriber, error) {
	steps := startSteps{user: userLookup}
	t := time.Now()
	cfg := req.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	cwd := u.ResolvePath(cfg.GetCwd(), s.settings.DefaultWorkdir())
	if cfg.Cwd == nil && s.settings.DefaultWorkdir() == "" {
		// Accounts such as nobody have a home that does not exist.
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			cwd = "/"
		}
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist or is not a directory", cwd))
	}

	cmd := exec.Command(cfg.GetCmd(), cfg.GetArgs()...)
	cmd.Dir = cwd
	cmd.Env = s.environ(u, cfg.GetEnvs())
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if cred := credential(u); cred != nil {
		cmd.SysProcAttr.Credential = cred
	}

	p := &proc{tag: optional(req.Tag), config: cfg, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	steps.prepare, t = time.Since(t), time.Now()
	var readers []*os.File
	var childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}

	if req.Pty != nil {
		master, slave, err := pty.Open()
		if err != nil {
			return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("opening a pty: %w", err))
		}
		if size := req.GetPty().GetSize(); size != nil && size.GetCols() > 0 && size.GetRows() > 0 {
			_ = pty.Setsize(master, &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())})
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		// A new session with the PTY as its controlling terminal, like a login.
		cmd.SysProcAttr.Setsid = true
		cmd.SysProcAttr.Setctty = true
		p.pty = master
		readers = append(readers, master)
		childEnds = append(childEnds, slave)
	} else {
		// Its own process group, so signals reach the children of a shell too.
		cmd.SysProcAttr.Setpgid = true
		outR, outW, err := os.Pipe()
		if err != nil {
			return nil, nil, connect.NewError(connect.CodeInternal, err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{outR, outW})
			return nil, nil, connect.NewError(connect.CodeInternal, err)
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		readers = append(readers, outR, errR)
		childEnds = append(childEnds, outW, errW)
		if req.Stdin == nil || req.GetStdin() {
			inR, inW, err := os.Pipe()
			if err != nil {
				closeAll(append(readers, childEnds...))
				return nil, nil, connect.NewError(connect.CodeInternal, err)
			}
			cmd.Stdin = inR
			p.stdin = inW
			childEnds = append(childEnds, inR)
		} // else nil Stdin: exec connects /dev/null
	}

	log := s.log
	steps.stdio = time.Since(t)
	started := time.Now()
	pid, exited, err := s.reaper.StartCmd(cmd)
	steps.exec = time.Since(started)
	closeAll(childEnds)
	if err != nil {
		closeAll(readers)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("starting %q: %w", cfg.GetCmd(), err))
	}
	p.pid = uint32(pid)
	s.add(p)
	sub := p.subscribe()
	logStarted(log, p, u, cwd, steps)

	var pumps sync.WaitGroup
	if p.pty != nil {
		pumps.Add(1)
		go p.pump(p.pty, outPTY, log, &pumps)
	} else {
		pumps.Add(2)
		go p.pump(readers[0], outStdout, log, &pumps)
		go p.pump(readers[1], outStderr, log, &pumps)
	}

	var timer *time.Timer
	if lifetime > 0 {
		timer = time.AfterFunc(lifetime, func() {
			p.timedOut.Store(true)
			_ = p.signal(syscall.SIGKILL)
		})
	}

	go func() {
		ws := <-exited
		if timer != nil {
			timer.Stop()
		}
		deadline := time.Now().Add(drainGrace)
		for _, r := range readers {
			_ = r.SetReadDeadline(deadline)
		}
		pumps.Wait()
		closeAll(readers)
		_ = p.closeStdin()
		end := endEvent(ws)
		// Logged before the end event goes out, so the log holds the whole
		// story of a process by the time its client hears that it ended.
		logEnded(log, p, ws, end, started)
		s.remove(p)
		p.finish(end)
	}()
	return p, sub, nil
}

// environ builds a process environment: PATH, HOME, USER and LOGNAME for the
// user, then the sandbox defaults, then the request's envs (the request wins).
func (s *Service) environ(u *users.User, req map[string]string) []string {
	env := map[string]string{
		"PATH":    defaultPath,
		"HOME":    u.Home,
		"USER":    u.Name,
		"LOGNAME": u.Name,
	}
	for k, v := range s.settings.EnvVars() {
		env[k] = v
	}
	for k, v := range req {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// credential returns the credentials to run as u, or nil when envd already
// runs as u (an unprivileged envd cannot switch users and need not).
func credential(u *users.User) *syscall.Credential {
	if uint32(os.Geteuid()) == u.UID && uint32(os.Getegid()) == u.GID {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

func optional(s *string) *string {
	if s == nil {
		return nil
	}
	v := *s
	return &v
}
