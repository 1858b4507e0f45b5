// Package steptrace records how long the steps of one operation took (a
// sandbox create: slot, rootfs, runtime start, envd health, /init, ...),
// so that benchmarks and the debug log can break a latency into its parts
// without a second copy of the code path.
//
// A Trace travels in a context. Code that does a step calls Mark on the
// trace of its context when the step ends; without a trace in the
// context (tests, callers that do not ask) Mark does nothing and costs a
// context lookup. A Trace belongs to one operation: it has its own small
// mutex, never a shared one.
package steptrace

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Step is one named part of an operation and how long it took.
type Step struct {
	Name string
	D    time.Duration
}

// Trace is the steps of one operation, in the order they ended.
type Trace struct {
	mu    sync.Mutex
	last  time.Time
	steps []Step
}

// New starts a trace; the first step is timed from now.
func New() *Trace { return &Trace{last: time.Now(), steps: make([]Step, 0, 12)} }

type key struct{}

// With returns ctx carrying t.
func With(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, key{}, t)
}

// From is the trace ctx carries, or nil (whose methods do nothing).
func From(ctx context.Context) *Trace {
	t, _ := ctx.Value(key{}).(*Trace)
	return t
}

// Mark ends step name: it took the time since the previous mark (or since
// New).
func (t *Trace) Mark(name string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	t.steps = append(t.steps, Step{Name: name, D: now.Sub(t.last)})
	t.last = now
	t.mu.Unlock()
}

// Steps is a copy of the steps marked so far.
func (t *Trace) Steps() []Step {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Step(nil), t.steps...)
}

// String is the steps as "name=ms,name=ms" with microsecond precision,
// for a log line a benchmark can parse.
func (t *Trace) String() string {
	var b strings.Builder
	for i, s := range t.Steps() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.Name)
		b.WriteByte('=')
		b.WriteString(strconv.FormatFloat(float64(s.D.Microseconds())/1000, 'f', 3, 64))
	}
	return b.String()
}
