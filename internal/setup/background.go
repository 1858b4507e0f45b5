package setup

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/image"
)

// BuildState is where a background build of a built-in template is.
type BuildState string

const (
	BuildNotStarted BuildState = ""
	BuildBuilding   BuildState = "building"
	BuildReady      BuildState = "ready"
	BuildFailed     BuildState = "error"
)

// Background builds the code-interpreter-v1 template while `warren serve`
// serves (its --build-code-interpreter: `make run` reaches a usable base
// without waiting for it). Until it is ready, its state explains to a
// create why the template is not there (Pending); a failed build stays
// failed until the next start, which tries again. Nothing of an
// interrupted build is left behind: a cancelled build removes its
// overlay and directory before Wait returns, and one that was killed is
// removed by the image store's cleanup at the next start.
type Background struct {
	store *image.Store
	build func(ctx context.Context, s *image.Store, progress *logWriter) error
	log   *slog.Logger

	mu       sync.Mutex
	state    BuildState
	started  time.Time
	finished time.Time
	err      error
	done     chan struct{}
}

// NewCodeInterpreterBuild prepares a background build of code-interpreter-v1
// into s (on s's base, which must exist); Start starts it.
func NewCodeInterpreterBuild(s *image.Store, log *slog.Logger) *Background {
	return newBackground(s, log, func(ctx context.Context, s *image.Store, progress *logWriter) error {
		_, err := baseimage.EnsureCodeInterpreter(ctx, s, baseimage.Options{}, progress)
		return err
	})
}

func newBackground(s *image.Store, log *slog.Logger, build func(context.Context, *image.Store, *logWriter) error) *Background {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Background{store: s, build: build, log: log, done: make(chan struct{})}
}

// Start builds the template in a goroutine, unless a complete one of the
// current recipe is there already (then it is ready at once). The build
// ends when ctx does; Wait waits for its cleanup.
func (b *Background) Start(ctx context.Context) {
	b.mu.Lock()
	b.state, b.started = BuildBuilding, time.Now()
	b.mu.Unlock()
	id := baseimage.CodeInterpreterID
	go func() {
		defer close(b.done)
		progress := &logWriter{log: b.log, template: id}
		err := b.build(ctx, b.store, progress)
		progress.Flush()
		b.mu.Lock()
		b.finished = time.Now()
		took := b.finished.Sub(b.started).Round(100 * time.Millisecond)
		if err == nil {
			b.state = BuildReady
		} else {
			b.state, b.err = BuildFailed, err
		}
		b.mu.Unlock()
		switch {
		case err == nil:
			b.log.Info("built-in template ready", "template", id, "took", took.String())
		case ctx.Err() != nil:
			b.log.Info("built-in template build stopped with the server; the next start builds it", "template", id)
		default:
			b.log.Error("built-in template build failed: its creates get 503; the next start of warren serve tries again",
				"template", id, "took", took.String(), "err", err)
		}
	}()
}

// Wait waits until a started build has ended and cleaned up.
func (b *Background) Wait() {
	b.mu.Lock()
	started := b.state != BuildNotStarted
	b.mu.Unlock()
	if started {
		<-b.done
	}
}

// Done is closed once a started build has ended and cleaned up.
func (b *Background) Done() <-chan struct{} { return b.done }

// State is the build's state, when it started, and its error if it
// failed.
func (b *Background) State() (BuildState, time.Time, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.started, b.err
}

// Pending explains why template name is not there yet while it is this
// build's to make ("" if it is not, or the build has ended well).
func (b *Background) Pending(name string) string {
	if name != baseimage.CodeInterpreterID {
		return ""
	}
	state, started, err := b.State()
	switch state {
	case BuildBuilding:
		return fmt.Sprintf("the %s template is being built on this node (for %s so far; it takes a few minutes on a fresh machine): retry when it is ready",
			name, time.Since(started).Round(time.Second))
	case BuildFailed:
		return fmt.Sprintf("the %s template's build on this node failed (%s); the next start of warren serve tries again, and its log says more",
			name, firstLine(err.Error()))
	}
	return ""
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// logWriter logs a build's progress line by line: its steps
// ("[code-interpreter-v1  12.3s] apt-get install ...") at info, the tools'
// output at debug.
type logWriter struct {
	log      *slog.Logger
	template string
	mu       sync.Mutex
	buf      []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// Flush logs a last, unterminated line.
func (w *logWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.line(string(w.buf))
		w.buf = nil
	}
}

func (w *logWriter) line(l string) {
	l = strings.TrimRight(l, "\r ")
	if l == "" {
		return
	}
	if strings.HasPrefix(l, "["+w.template+" ") {
		w.log.Info("built-in template build", "template", w.template, "step", l)
		return
	}
	w.log.Debug("built-in template build output", "template", w.template, "line", l)
}
