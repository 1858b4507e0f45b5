package setup

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// reporter is what a run of setup says: to progress, concise lines (a
// step, the time since the start, and while a step works a count of the
// lines its tools wrote); the tools' raw output (debootstrap, apt, go
// build) goes to log. With no log, progress gets the raw output too, as
// the tests that call Run want. r.mu serialises the writes of the steps
// that run side by side.
type reporter struct {
	mu       sync.Mutex
	progress io.Writer
	log      io.Writer // nil: raw output to progress
	logPath  string    // what a failure names
	start    time.Time
	running  map[*stepOutput]bool
}

// tailLines is how many of a failed step's last output lines it prints.
const tailLines = 20

func newReporter(progress, log io.Writer, logPath string) *reporter {
	return &reporter{progress: progress, log: log, logPath: logPath, start: time.Now(), running: map[*stepOutput]bool{}}
}

// say prints one progress line.
func (r *reporter) say(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sayLocked(format, args...)
}

func (r *reporter) sayLocked(format string, args ...any) {
	fmt.Fprintf(r.progress, "setup [%6.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// step returns the writer for one step's tools. Steps run side by side:
// each passes on whole lines only, so that two steps' output never mixes
// within a line. Close it when the step ends.
func (r *reporter) step(name string) *stepOutput {
	s := &stepOutput{r: r, name: name}
	r.mu.Lock()
	r.running[s] = true
	r.mu.Unlock()
	return s
}

// heartbeat says, every interval until stop is closed, how far each
// running step with new output has got, and every third interval that a
// quiet one still works: a debootstrap or a go build says nothing of its
// own for minutes in the concise view otherwise.
func (r *reporter) heartbeat(interval time.Duration, stop <-chan struct{}) {
	if r.log == nil {
		return // the raw output shows it
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		for _, s := range r.sorted() {
			// A step with new output, or one quiet for three intervals
			// (a go build says nothing for minutes): it is still working.
			s.quiet++
			if s.lines > s.reported || s.quiet >= 3 {
				s.reported, s.quiet = s.lines, 0
				r.sayLocked("%s: working, %d lines of output so far", s.name, s.lines)
			}
		}
		r.mu.Unlock()
	}
}

// sorted lists the running steps by name (r.mu held), for a stable order.
func (r *reporter) sorted() []*stepOutput {
	var out []*stepOutput
	for s := range r.running {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// failed prints a failed step's last lines of output and where all of it
// is.
func (r *reporter) failed(s *stepOutput) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.log == nil {
		return // it was all on progress
	}
	r.sayLocked("%s failed; the last %d lines of its output (all of it: %s):", s.name, len(s.tail), r.logPath)
	for _, l := range s.tail {
		fmt.Fprintf(r.progress, "    %s\n", l)
	}
}

// buildStep matches a template build's own progress lines
// ("[base   12.3s] debootstrap ...", internal/image).
var buildStep = regexp.MustCompile(`^\[(\S+)\s+[0-9.]+s\] (.*)$`)

// stepOutput is the writer one step's tools write to.
type stepOutput struct {
	r        *reporter
	name     string
	buf      []byte   // a partial line
	lines    int      // whole lines written (r.mu)
	reported int      // lines as of the last heartbeat that said them (r.mu)
	quiet    int      // heartbeats since the step was last reported (r.mu)
	tail     []string // the last tailLines lines (r.mu)
}

func (s *stepOutput) Write(p []byte) (int, error) {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			break
		}
		s.lineLocked(string(s.buf[:i]))
		s.buf = s.buf[i+1:]
	}
	if len(s.buf) == 0 {
		s.buf = nil
	}
	return len(p), nil
}

// Close passes on a last, unterminated line and ends the step's
// heartbeat.
func (s *stepOutput) Close() error {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if len(s.buf) > 0 {
		s.lineLocked(string(s.buf))
		s.buf = nil
	}
	delete(s.r.running, s)
	return nil
}

func (s *stepOutput) lineLocked(l string) {
	r := s.r
	if r.log == nil {
		fmt.Fprintln(r.progress, l)
		return
	}
	if strings.HasPrefix(l, s.name+": ") { // runsc's and runc's installers name themselves
		fmt.Fprintln(r.log, l)
	} else {
		fmt.Fprintf(r.log, "%s: %s\n", s.name, l)
	}
	s.lines++
	s.tail = append(s.tail, l)
	if len(s.tail) > tailLines {
		s.tail = s.tail[1:]
	}
	if m := buildStep.FindStringSubmatch(strings.TrimRight(l, "\r ")); m != nil {
		r.sayLocked("%s: %s", m[1], m[2])
	}
}
