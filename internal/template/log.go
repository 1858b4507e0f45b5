package template

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/warren-sandbox/warren/internal/store"
)

// buildLog collects a build's log lines and writes them to the store in
// batches (a RUN step can print thousands of lines; one insert each would
// make the log the build's bottleneck). Status polls see a line within
// flushEvery.
//
// A build runs tenant commands, whose output is unbounded (`RUN yes`), so
// the log is bounded at every level:
//   - a line keeps at most maxLineBytes, the rest replaced by a marker;
//   - a command keeps its first commandHeadLines and last
//     commandTailLines lines, with one "N lines dropped" entry between;
//   - a build keeps at most buildMaxLines lines and buildMaxBytes of
//     output, then one "N lines dropped" entry at its end;
//   - the builder's own entries (step headers, progress, warnings) have
//     a budget of their own (noteMaxLines, noteMaxBytes), so that output
//     cannot crowd them out; the build's final error is always kept.
//
// What is pending in memory is therefore bounded by the build's caps
// whatever the store's speed, and dropped output costs a count, not a
// copy.
type buildLog struct {
	st      store.Store
	buildID string
	// sink, when set, takes the batches instead of the store: the log of
	// work that has no build (newSinkLog).
	sink func([]store.BuildLogEntry)

	mu      sync.Mutex
	closed  bool
	pending []store.BuildLogEntry
	step    string
	partial map[bool]*partialLine // unterminated output, by stream (stderr?)

	// The current command's output.
	cmdLines   int                   // lines seen
	cmdTail    []store.BuildLogEntry // ring of its last lines once past the head
	cmdTailAt  int                   // next slot of cmdTail to overwrite once full
	cmdDropped int                   // lines neither in the head nor in cmdTail

	// The build's totals.
	outLines, outBytes   int
	outDropped           int // output lines dropped by the build's caps
	noteLines, noteBytes int
	notesDropped         int

	stop chan struct{}
	done chan struct{}
}

const (
	flushEvery = 200 * time.Millisecond

	maxLineBytes     = 4096
	commandHeadLines = 2000
	commandTailLines = 500
	buildMaxLines    = 20000
	buildMaxBytes    = 8 << 20
	noteMaxLines     = 2000
	noteMaxBytes     = 1 << 20
)

// partialLine is output not yet ended by a newline, kept up to
// maxLineBytes; cut counts the bytes past that.
type partialLine struct {
	b   []byte
	cut int
}

func (p *partialLine) add(b []byte) {
	room := maxLineBytes - len(p.b)
	if len(b) > room {
		p.cut += len(b) - room
		b = b[:room]
	}
	p.b = append(p.b, b...)
}

func (p *partialLine) empty() bool { return len(p.b) == 0 && p.cut == 0 }

func (p *partialLine) reset() { p.b, p.cut = p.b[:0], 0 }

// take returns the line, valid UTF-8 with a marker if it was cut, and
// empties p.
func (p *partialLine) take() string {
	b := bytes.TrimRight(p.b, "\r")
	cut := p.cut
	if cut > 0 {
		// Do not leave half a character where the line was cut.
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0; i++ {
			if r, size := utf8.DecodeLastRune(b); r != utf8.RuneError || size != 1 {
				break
			}
			b = b[:len(b)-1]
			cut++
		}
	}
	msg := strings.ToValidUTF8(string(b), "\uFFFD")
	if cut > 0 {
		msg += fmt.Sprintf(" … [%d bytes truncated]", cut)
	}
	p.reset()
	return msg
}

func newBuildLog(st store.Store, buildID string) *buildLog {
	l := &buildLog{st: st, buildID: buildID, partial: map[bool]*partialLine{}, stop: make(chan struct{}), done: make(chan struct{})}
	go l.loop()
	return l
}

// newSinkLog is a log with the bounds of a build's whose batches go to
// sink rather than to a build in the store.
func newSinkLog(sink func([]store.BuildLogEntry)) *buildLog {
	l := &buildLog{sink: sink, partial: map[bool]*partialLine{}, stop: make(chan struct{}), done: make(chan struct{})}
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
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.endCommandLocked()
	if l.outDropped > 0 {
		l.forceLocked("warn", fmt.Sprintf("… %d lines dropped: a build's log keeps at most %d lines and %d MiB of output …",
			l.outDropped, buildMaxLines, buildMaxBytes>>20))
	}
	if l.notesDropped > 0 {
		l.forceLocked("warn", fmt.Sprintf("… %d lines dropped: a build's log keeps at most %d lines of the builder's own …", l.notesDropped, noteMaxLines))
	}
	l.closed = true
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
	if l.sink != nil {
		l.sink(batch)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = l.st.AppendBuildLogs(ctx, l.buildID, batch...)
}

// setStep makes later lines belong to step ("base", "1"…, "finalize");
// it ends the current command's output.
func (l *buildLog) setStep(step string) {
	l.mu.Lock()
	l.endCommandLocked()
	l.step = step
	l.mu.Unlock()
}

// commandDone ends a command's output: its unterminated lines and its
// kept tail are logged.
func (l *buildLog) commandDone() {
	l.mu.Lock()
	l.endCommandLocked()
	l.mu.Unlock()
}

func (l *buildLog) add(level, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if level == "error" {
		// The build's failure: one per build, always kept.
		l.forceLocked(level, truncateNote(msg))
		return
	}
	l.noteLocked(level, truncateNote(msg))
}

// truncateNote bounds one of the builder's own entries (they quote user
// input: commands, image names, errors) like an output line.
func truncateNote(msg string) string {
	if len(msg) <= maxLineBytes {
		return msg
	}
	p := partialLine{}
	p.add([]byte(msg))
	return p.take()
}

// noteLocked logs one of the builder's own entries, within its budget.
func (l *buildLog) noteLocked(level, msg string) {
	if l.noteLines >= noteMaxLines || l.noteBytes+len(msg) > noteMaxBytes {
		l.notesDropped++
		return
	}
	l.noteLines++
	l.noteBytes += len(msg)
	l.forceLocked(level, msg)
}

func (l *buildLog) forceLocked(level, msg string) {
	l.pending = append(l.pending, store.BuildLogEntry{Time: time.Now(), Level: level, Step: l.step, Message: msg})
}

func (l *buildLog) info(format string, args ...any)   { l.add("info", format, args...) }
func (l *buildLog) warn(format string, args ...any)   { l.add("warn", format, args...) }
func (l *buildLog) errorf(format string, args ...any) { l.add("error", format, args...) }

// buildFull tells whether the build takes no more output.
func (l *buildLog) buildFull() bool {
	return l.outLines >= buildMaxLines || l.outBytes >= buildMaxBytes
}

// output takes a command's output, logged one line per entry.
func (l *buildLog) output(stderr bool, data []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	p := l.partial[stderr]
	if p == nil {
		p = &partialLine{}
		l.partial[stderr] = p
	}
	skipped := false
	for len(data) > 0 {
		if l.buildFull() {
			l.dropOutputLocked(p, data)
			return
		}
		if l.cmdLines >= commandHeadLines && !skipped {
			data = l.skipToTailLocked(p, data)
			skipped = true
		}
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			p.add(data)
			return
		}
		p.add(data[:i])
		l.outputLineLocked(p.take())
		data = data[i+1:]
	}
}

// dropOutputLocked counts the lines of data, which a full build drops.
func (l *buildLog) dropOutputLocked(p *partialLine, data []byte) {
	n := bytes.Count(data, []byte{'\n'})
	l.outDropped += n
	if n > 0 {
		p.reset()
		data = data[bytes.LastIndexByte(data, '\n')+1:]
	}
	p.add(data)
}

// skipToTailLocked drops, past the command's head, the lines of data
// that its last commandTailLines lines would push out of the tail
// anyway, and returns the rest: a flood costs a count, not a copy of
// each line.
func (l *buildLog) skipToTailLocked(p *partialLine, data []byte) []byte {
	end := bytes.LastIndexByte(data, '\n')
	for k := 0; k < commandTailLines && end >= 0; k++ {
		end = bytes.LastIndexByte(data[:end], '\n')
	}
	if end < 0 {
		return data
	}
	n := bytes.Count(data[:end+1], []byte{'\n'})
	l.cmdLines += n
	l.cmdDropped += n
	p.reset()
	return data[end+1:]
}

// outputLineLocked logs a complete line of the current command's output:
// in its head, or into its tail.
func (l *buildLog) outputLineLocked(msg string) {
	l.cmdLines++
	if l.cmdLines <= commandHeadLines {
		l.emitOutputLocked(store.BuildLogEntry{Time: time.Now(), Level: "info", Step: l.step, Message: msg})
		return
	}
	e := store.BuildLogEntry{Time: time.Now(), Level: "info", Step: l.step, Message: msg}
	if len(l.cmdTail) < commandTailLines {
		l.cmdTail = append(l.cmdTail, e)
		return
	}
	l.cmdTail[l.cmdTailAt] = e
	l.cmdTailAt = (l.cmdTailAt + 1) % commandTailLines
	l.cmdDropped++
}

// emitOutputLocked queues a line of output within the build's caps.
func (l *buildLog) emitOutputLocked(e store.BuildLogEntry) {
	if l.buildFull() {
		l.outDropped++
		return
	}
	if l.outBytes+len(e.Message) > buildMaxBytes {
		l.outBytes = buildMaxBytes // full: later lines are counted, not kept
		l.outDropped++
	} else {
		l.outLines++
		l.outBytes += len(e.Message)
		l.pending = append(l.pending, e)
	}
	if l.buildFull() {
		l.noteLocked("warn", fmt.Sprintf("the build's log is full (%d lines or %d MiB of output): later output is counted, not kept",
			buildMaxLines, buildMaxBytes>>20))
	}
}

// endCommandLocked ends the current command's output: what did not end
// with a newline, the count of the lines dropped, and the kept tail.
func (l *buildLog) endCommandLocked() {
	for _, stderr := range []bool{false, true} {
		if p := l.partial[stderr]; p != nil && !p.empty() {
			if l.buildFull() {
				l.outDropped++
				p.reset()
				continue
			}
			l.outputLineLocked(p.take())
		}
	}
	if l.cmdDropped > 0 {
		if l.buildFull() {
			l.outDropped += l.cmdDropped
		} else {
			l.noteLocked("warn", fmt.Sprintf("… %d lines dropped: a command's log keeps its first %d and last %d lines …",
				l.cmdDropped, commandHeadLines, commandTailLines))
		}
	}
	for i := range l.cmdTail {
		l.emitOutputLocked(l.cmdTail[(l.cmdTailAt+i)%len(l.cmdTail)])
	}
	l.cmdLines, l.cmdTail, l.cmdTailAt, l.cmdDropped = 0, nil, 0, 0
}
