package process

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/envd/users"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
)

// What one process may put into envd's log. envd.log is what the platform
// shows for a sandbox: enough output to see why a command failed, never so
// much that a chatty process buries everything else.
const (
	logArgsMax   = 512      // bytes of the joined args on "process started"
	logLineMax   = 1024     // bytes of one output line
	logLinesMax  = 100      // output lines per process and stream
	logOutputMax = 16 << 10 // output bytes per process and stream
)

// startSteps is what a process's start took inside envd: resolving its
// user, preparing the command (working directory, environment,
// credentials), its stdio (pipes or a PTY), and the fork and exec until
// the reaper had its pid. They go on the "process started" line, so that
// a slow start says where its time went (internal/node's CommandSteps
// benchmark reads them).
type startSteps struct {
	user, prepare, stdio, exec time.Duration
}

func logStarted(l *slog.Logger, p *proc, u *users.User, cwd string, steps startSteps) {
	attrs := []any{
		"pid", p.pid,
		"cmd", p.config.GetCmd(),
		"args", truncate(strings.Join(p.config.GetArgs(), " "), logArgsMax),
	}
	if p.tag != nil {
		attrs = append(attrs, "tag", *p.tag)
	}
	attrs = append(attrs, "user", u.Name, "cwd", cwd, "pty", p.pty != nil,
		"user_lookup_us", steps.user.Microseconds(), "prepare_us", steps.prepare.Microseconds(),
		"stdio_us", steps.stdio.Microseconds(), "exec_us", steps.exec.Microseconds())
	l.Info("process started", attrs...)
}

func logEnded(l *slog.Logger, p *proc, ws syscall.WaitStatus, end *pb.ProcessEvent, started time.Time) {
	attrs := []any{"pid", p.pid, "exit_code", end.GetEnd().GetExitCode()}
	if ws.Signaled() {
		attrs = append(attrs, "signal", unix.SignalName(ws.Signal()))
	}
	attrs = append(attrs, "duration_ms", time.Since(started).Milliseconds())
	l.Info("process ended", attrs...)
}

// outputLog copies the lines of one output stream of a process into envd's
// log, within the bounds above. The stream's pump owns it, so it needs no
// lock; it splits the chunks the pump has already read, and holds at most
// one (truncated) line, so the output path gains neither a goroutine nor an
// unbounded buffer.
type outputLog struct {
	log    *slog.Logger // nil when not logging, or once the budget is spent
	pid    uint32
	stream string

	line  []byte // the current line so far, at most logLineMax bytes
	full  bool   // the current line was cut: ignore the rest of it
	lines int    // lines logged
	bytes int    // bytes logged
}

func newOutputLog(l *slog.Logger, pid uint32, kind output) *outputLog {
	o := &outputLog{pid: pid, stream: [...]string{outStdout: "stdout", outStderr: "stderr", outPTY: "pty"}[kind]}
	// With logging off (the default), skip the splitting altogether.
	if l.Enabled(context.Background(), slog.LevelInfo) {
		o.log = l
	}
	return o
}

// write takes the next chunk of the stream.
func (o *outputLog) write(b []byte) {
	for o.log != nil && len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			o.add(b)
			return
		}
		o.add(b[:i])
		o.emit()
		b = b[i+1:]
	}
}

// flush logs a last line that had no newline; the pump calls it at the end
// of the stream.
func (o *outputLog) flush() {
	if o.log != nil && (len(o.line) > 0 || o.full) {
		o.emit()
	}
}

func (o *outputLog) add(b []byte) {
	if o.full {
		return
	}
	if room := logLineMax - len(o.line); len(b) > room {
		b = truncate(b, room)
		o.full = true
	}
	o.line = append(o.line, b...)
}

func (o *outputLog) emit() {
	// A PTY ends lines with \r\n.
	line := bytes.TrimSuffix(o.line, []byte("\r"))
	o.line, o.full = o.line[:0], false
	if o.lines == logLinesMax || o.bytes+len(line) > logOutputMax {
		o.log.Info("output truncated in log", "pid", o.pid, "stream", o.stream)
		o.log, o.line = nil, nil
		return
	}
	o.lines++
	o.bytes += len(line)
	o.log.Info(string(line), "pid", o.pid, "stream", o.stream)
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence, so
// the JSON log does not show a stray replacement character at the cut.
func truncate[S ~string | ~[]byte](s S, n int) S {
	if len(s) <= n {
		return s
	}
	// Back off over the continuation bytes of at most one sequence; in
	// binary output there may be more, and then any cut will do.
	for i := n; i > 0 && i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i]
		}
	}
	return s[:n]
}
