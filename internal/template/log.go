package template

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// buildLog collects a build's log lines and writes them to the store in
// batches (a RUN step can print thousands of lines; one insert each would
// make the log the build's bottleneck). Status polls see a line within
// flushEvery.
type buildLog struct {
	st      store.Store
	buildID string

	mu      sync.Mutex
	pending []store.BuildLogEntry
	step    string
	partial map[bool][]byte // unterminated output, by stream (stderr?)
	stop    chan struct{}
	done    chan struct{}
}

const (
	flushEvery = 200 * time.Millisecond
	// maxLine bounds one log line; longer output is split.
	maxLine = 4096
)

func newBuildLog(st store.Store, buildID string) *buildLog {
	l := &buildLog{st: st, buildID: buildID, partial: map[bool][]byte{}, stop: make(chan struct{}), done: make(chan struct{})}
	go l.loop()
	return l
}

func (l *buildLog) loop() {
	defer close(l.done)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			l.flush()
		case <-l.stop:
			l.flush()
			return
		}
	}
}

// close writes what is pending; the log takes no lines after.
func (l *buildLog) close() {
	l.mu.Lock()
	l.endOutputLocked()
	l.mu.Unlock()
	close(l.stop)
	<-l.done
}

func (l *buildLog) flush() {
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	l.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = l.st.AppendBuildLogs(ctx, l.buildID, batch...)
}

// setStep makes later lines belong to step ("base", "1"…, "finalize").
func (l *buildLog) setStep(step string) {
	l.mu.Lock()
	l.endOutputLocked()
	l.step = step
	l.mu.Unlock()
}

func (l *buildLog) add(level, format string, args ...any) {
	l.mu.Lock()
	l.addLocked(level, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *buildLog) addLocked(level, msg string) {
	l.pending = append(l.pending, store.BuildLogEntry{Time: time.Now(), Level: level, Step: l.step, Message: msg})
}

func (l *buildLog) info(format string, args ...any)   { l.add("info", format, args...) }
func (l *buildLog) warn(format string, args ...any)   { l.add("warn", format, args...) }
func (l *buildLog) errorf(format string, args ...any) { l.add("error", format, args...) }

// output takes a command's output, logged one line per entry.
func (l *buildLog) output(stderr bool, data []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	buf := append(l.partial[stderr], data...)
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		l.addLine(buf[:i])
		buf = buf[i+1:]
	}
	for len(buf) > maxLine {
		l.addLine(buf[:maxLine])
		buf = buf[maxLine:]
	}
	l.partial[stderr] = append([]byte(nil), buf...)
}

func (l *buildLog) addLine(b []byte) {
	l.addLocked("info", strings.TrimRight(string(b), "\r"))
}

// endOutputLocked logs output that did not end with a newline.
func (l *buildLog) endOutputLocked() {
	for k, b := range l.partial {
		if len(b) > 0 {
			l.addLine(b)
		}
		delete(l.partial, k)
	}
}
