package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// cli calls a runtime binary. Every call is bounded by timeout on top of
// the caller's context: runtimes can hang (runsc on a broken platform spins
// forever), and nothing here may hang with them.
type cli struct {
	bin     string
	timeout time.Duration
}

// call is one invocation.
type call struct {
	args []string
	// stdio, if set, receives the command's stdout and stderr instead of
	// pipes. Commands that leave a sandbox running (run, restore) hand
	// their stdio to it, so it must be a file: a pipe would stay open for
	// the sandbox's lifetime and Wait would block on it.
	stdio *os.File
	// errLog is the runtime's --log file, where it writes its errors as
	// JSON lines; read on failure when stderr went to stdio.
	errLog string
}

// CommandError is a failed runtime command.
type CommandError struct {
	Command string // e.g. "runsc checkpoint"
	ID      string
	Err     error  // *exec.ExitError, a context error, ...
	Message string // what the runtime said, trimmed
}

func (e *CommandError) Error() string {
	s := fmt.Sprintf("%s %s: %v", e.Command, e.ID, e.Err)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

func (e *CommandError) Unwrap() error { return e.Err }

// run runs c.bin with k.args and returns its stdout.
func (c *cli) run(ctx context.Context, id string, k call) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, k.args...)
	// On timeout, kill the runtime and whatever it forked in its process
	// group (a half-made container's init), not only the runtime itself.
	// Sandboxes that outlive the command are unaffected: runsc starts its
	// sandbox in a new session, and a finished command is never killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A runtime may leave children holding our pipes (a checkpoint gofer,
	// a sandbox that inherited stderr); don't wait on them for long.
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr bytes.Buffer
	var stdioOff int64
	if k.stdio != nil {
		cmd.Stdout, cmd.Stderr = k.stdio, k.stdio
		stdioOff = fileSize(k.stdio.Name())
	} else {
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
	}
	logOff := fileSize(k.errLog)
	start := time.Now()
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	ce := &CommandError{Command: commandName(c.bin, k.args), ID: id, Err: err}
	if ctx.Err() != nil {
		ce.Err = fmt.Errorf("%w after %v (%v)", ctx.Err(), time.Since(start).Round(time.Millisecond), err)
	}
	ce.Message = strings.TrimSpace(stderr.String())
	if m := errorsFromLog(k.errLog, logOff); m != "" {
		ce.Message = joinNonEmpty(ce.Message, m)
	}
	if ce.Message == "" && k.stdio != nil {
		ce.Message = tailFrom(k.stdio.Name(), stdioOff, 2048)
	}
	return stdout.Bytes(), ce
}

// subcommands are the runtime subcommands we call, to name them in errors.
var subcommands = map[string]bool{
	"run": true, "restore": true, "checkpoint": true, "pause": true, "resume": true,
	"kill": true, "delete": true, "state": true, "list": true, "exec": true,
}

// commandName is the binary's base name and the subcommand.
func commandName(bin string, args []string) string {
	name := bin[strings.LastIndexByte(bin, '/')+1:]
	for _, a := range args {
		if subcommands[a] {
			return name + " " + a
		}
	}
	return name
}

func fileSize(p string) int64 {
	if p == "" {
		return 0
	}
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// tailFrom returns at most max bytes written to p after offset off.
func tailFrom(p string, off int64, max int64) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	if size := fileSize(p); size-off > max {
		off = size - max
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	return strings.TrimSpace(string(b))
}

// errorsFromLog extracts the error messages that runc and runsc wrote to
// their --log file (JSON lines {"level":"error","msg":...}) after off.
func errorsFromLog(p string, off int64) string {
	if p == "" {
		return ""
	}
	var msgs []string
	for _, line := range strings.Split(tailFrom(p, off, 16<<10), "\n") {
		var e struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &e) == nil && (e.Level == "error" || e.Level == "fatal") && e.Msg != "" {
			msgs = append(msgs, strings.TrimSpace(e.Msg))
		}
	}
	return strings.Join(msgs, "; ")
}

func joinNonEmpty(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "" || strings.Contains(a, b):
		return a
	}
	return a + "; " + b
}

// isCommandError reports whether err came from the runtime binary saying
// no (as opposed to a timeout or a missing binary).
func isCommandError(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}
