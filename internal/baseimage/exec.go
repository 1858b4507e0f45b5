package baseimage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// run runs a command with its output going to progress. env nil means the
// host's environment. A failure's error ends with the output's last lines,
// since progress may be discarded.
func run(ctx context.Context, progress io.Writer, env []string, name string, args ...string) error {
	cmd := command(ctx, name, args...)
	tail := &tailWriter{max: 2048}
	w := io.MultiWriter(progress, tail)
	cmd.Stdout = w
	cmd.Stderr = w
	if env == nil {
		env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	}
	cmd.Env = env
	err := cmd.Run()
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil: // killed because the caller gave up
		return fmt.Errorf("%w (%s: %v)", ctx.Err(), name, err)
	default:
		return fmt.Errorf("%w; its output ended with:\n%s", err, bytes.TrimSpace(tail.buf))
	}
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

// command is exec.CommandContext, but when ctx ends it kills the whole
// process group (apt runs dpkg, which runs maintainer scripts), and it
// bounds the wait for output pipes held open by leftover children.
func command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}
