package egress

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Entry is one egress decision, a JSON line of the audit log.
type Entry struct {
	Time     time.Time `json:"time"`
	Sandbox  string    `json:"sandbox"`
	Team     string    `json:"team,omitempty"`
	Proto    string    `json:"proto"`          // tcp, tls, http, udp, icmp...
	Dst      string    `json:"dst"`            // the address the sandbox dialled, ip:port
	Host     string    `json:"host,omitempty"` // SNI or Host
	Decision string    `json:"decision"`       // allow or deny
	Rule     string    `json:"rule"`           // what decided: "allowOut 1.2.3.0/24", "allowOut *.example.com", "denyOut 0.0.0.0/0", "default", "node"
	Via      string    `json:"via,omitempty"`  // where the connection went instead of Dst: the host's address, or the egressProxy
	Request  string    `json:"request,omitempty"`
	Injected []string  `json:"injected,omitempty"` // header names a rule set (never values)
	Reason   string    `json:"reason,omitempty"`
}

// Decisions.
const (
	Allow = "allow"
	Deny  = "deny"
)

// Audit is the audit log: one JSON-lines file per sandbox under a
// directory (DIR/<sandboxID>.jsonl, rotated to .1 at MaxFileBytes, so a
// sandbox holds at most twice that), written by one goroutine so that no
// connection waits for the disk.
//
// Entries wait in a bounded queue per sandbox (auditQueuePerSandbox), and
// the writer takes one entry from each sandbox with entries in turn: a
// sandbox that logs faster than the disk takes fills its own queue and
// loses its own entries, never another sandbox's, and does not delay
// theirs by more than one entry each. Entries that find their queue full
// are counted and reported in that sandbox's next line written. Files
// outlive their sandbox (the audit is most wanted afterwards); Sweep
// bounds their age and total size.
type Audit struct {
	dir     string
	maxFile int64
	done    chan struct{}
	log     *slog.Logger

	qmu    sync.Mutex
	cond   *sync.Cond // on qmu: an entry was queued or written, or Close
	queues map[string]*auditQueue
	ready  []*auditQueue // queues with entries, in the writer's turn order
	closed bool
	// overflow counts entries dropped because auditMaxQueues sandboxes
	// already had entries waiting (reported in the node's log).
	overflow int64

	mu    sync.Mutex // file operations: the writer's rotation, readers
	files map[string]*os.File
}

// auditQueue is one sandbox's entries waiting for the writer.
type auditQueue struct {
	id      string
	entries []Entry
	dropped int64  // entries that found the queue full, not yet reported
	queued  uint64 // entries ever queued, and of them written: Flush waits on these
	written uint64
}

// DefaultAuditFileBytes is a sandbox's audit file size before rotation.
const DefaultAuditFileBytes = 1 << 20

const (
	// auditQueuePerSandbox bounds one sandbox's waiting entries: a few
	// seconds of the most the kernel logs for it (network.auditRate per
	// second) and of a busy proxy's connections.
	auditQueuePerSandbox = 1024
	// auditMaxQueues bounds the sandboxes with entries waiting, far above
	// the sandboxes a node runs (a bound on memory, not a policy).
	auditMaxQueues = 4096
)

// OpenAudit opens (creating) the audit directory and starts the writer.
func OpenAudit(dir string, maxFile int64, log *slog.Logger) (*Audit, error) {
	if maxFile <= 0 {
		maxFile = DefaultAuditFileBytes
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress: audit dir: %w", err)
	}
	a := &Audit{dir: dir, maxFile: maxFile, done: make(chan struct{}), log: log,
		queues: map[string]*auditQueue{}, files: map[string]*os.File{}}
	a.cond = sync.NewCond(&a.qmu)
	go a.write()
	return a, nil
}

// Log queues an entry; it never blocks. After Close it drops the entry.
func (a *Audit) Log(e Entry) {
	if a == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	a.qmu.Lock()
	defer a.qmu.Unlock()
	if a.closed {
		return
	}
	q := a.queues[e.Sandbox]
	if q == nil {
		if len(a.queues) >= auditMaxQueues {
			a.overflow++
			return
		}
		q = &auditQueue{id: e.Sandbox}
		a.queues[e.Sandbox] = q
	}
	if len(q.entries) >= auditQueuePerSandbox {
		q.dropped++
		return
	}
	q.entries = append(q.entries, e)
	q.queued++
	if len(q.entries) == 1 {
		a.ready = append(a.ready, q)
	}
	a.cond.Broadcast()
}

// Flush waits until every entry queued before it is written (or dropped
// by Close).
func (a *Audit) Flush() {
	if a == nil {
		return
	}
	a.qmu.Lock()
	defer a.qmu.Unlock()
	waitFor := make(map[*auditQueue]uint64, len(a.queues))
	for _, q := range a.queues {
		waitFor[q] = q.queued
	}
	for q, n := range waitFor {
		for q.written < n && !(a.closed && a.doneWriting()) {
			a.cond.Wait()
		}
	}
}

// doneWriting reports whether the writer has stopped; qmu is held.
func (a *Audit) doneWriting() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// Close writes what is queued and stops the writer.
func (a *Audit) Close() {
	if a == nil {
		return
	}
	a.qmu.Lock()
	if a.closed {
		a.qmu.Unlock()
		<-a.done
		return
	}
	a.closed = true
	a.cond.Broadcast()
	a.qmu.Unlock()
	<-a.done
}

// next waits for the next entry in turn and takes it from its queue,
// with the count of the sandbox's entries dropped before it. It reports
// false when the audit is closed and nothing is left.
func (a *Audit) next() (q *auditQueue, e Entry, dropped int64, ok bool) {
	a.qmu.Lock()
	defer a.qmu.Unlock()
	for len(a.ready) == 0 {
		if a.closed {
			return nil, Entry{}, 0, false
		}
		a.cond.Wait()
	}
	q = a.ready[0]
	a.ready = a.ready[1:]
	e = q.entries[0]
	q.entries = q.entries[1:]
	dropped, q.dropped = q.dropped, 0
	if len(q.entries) > 0 {
		a.ready = append(a.ready, q) // its next entry waits for the others' turns
	}
	return q, e, dropped, true
}

// wrote records that q's entry is written, and forgets q once it is empty.
func (a *Audit) wrote(q *auditQueue) (overflow int64) {
	a.qmu.Lock()
	defer a.qmu.Unlock()
	q.written++
	if len(q.entries) == 0 && q.dropped == 0 && a.queues[q.id] == q {
		delete(a.queues, q.id)
	}
	overflow, a.overflow = a.overflow, 0
	a.cond.Broadcast()
	return overflow
}

var auditName = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

func (a *Audit) write() {
	defer func() {
		a.mu.Lock()
		for _, f := range a.files {
			f.Close()
		}
		a.mu.Unlock()
		a.qmu.Lock()
		close(a.done)
		a.cond.Broadcast() // Flush waiters of a closed audit
		a.qmu.Unlock()
	}()
	for {
		q, e, dropped, ok := a.next()
		if !ok {
			return
		}
		if dropped > 0 {
			e.Reason = strings.TrimSpace(fmt.Sprintf("%s (%d earlier entries of this sandbox were dropped: it logged faster than its audit queue is written)", e.Reason, dropped))
		}
		if err := a.append(e); err != nil {
			a.log.Warn("egress audit: writing an entry", "sandbox", e.Sandbox, "err", err)
		}
		if n := a.wrote(q); n > 0 {
			a.log.Warn("egress audit: entries dropped: too many sandboxes had entries waiting", "dropped", n)
		}
	}
}

func (a *Audit) path(id string) string { return filepath.Join(a.dir, id+".jsonl") }

func (a *Audit) append(e Entry) error {
	if !auditName.MatchString(e.Sandbox) {
		return fmt.Errorf("bad sandbox id %q", e.Sandbox)
	}
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.files[e.Sandbox]
	if f == nil {
		if len(a.files) >= 64 {
			for id, f := range a.files {
				f.Close()
				delete(a.files, id)
			}
		}
		if f, err = os.OpenFile(a.path(e.Sandbox), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
			return err
		}
		a.files[e.Sandbox] = f
	}
	if fi, err := f.Stat(); err == nil && fi.Size()+int64(len(line)) > a.maxFile {
		f.Close()
		delete(a.files, e.Sandbox)
		if err := os.Rename(a.path(e.Sandbox), a.path(e.Sandbox)+".1"); err != nil {
			return err
		}
		if f, err = os.OpenFile(a.path(e.Sandbox), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
			return err
		}
		a.files[e.Sandbox] = f
	}
	_, err = f.Write(line)
	return err
}

// Read returns a sandbox's entries at or after since, oldest first, the
// newest limit of them (0: all).
func (a *Audit) Read(sandboxID string, since time.Time, limit int) ([]Entry, error) {
	if !auditName.MatchString(sandboxID) {
		return nil, fmt.Errorf("egress: bad sandbox id %q", sandboxID)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Entry
	for _, p := range []string{a.path(sandboxID) + ".1", a.path(sandboxID)} {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 4096), 64<<10)
		for sc.Scan() {
			var e Entry
			if json.Unmarshal(sc.Bytes(), &e) == nil && !e.Time.Before(since) {
				out = append(out, e)
			}
		}
		f.Close()
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

// Sweep removes the audit files of sandboxes keep does not claim that are
// older than maxAge, then the oldest of them until all files together
// take at most maxTotal bytes.
func (a *Audit) Sweep(keep func(sandboxID string) bool, maxAge time.Duration, maxTotal int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	type file struct {
		path string
		id   string
		mod  time.Time
		size int64
	}
	var files []file
	var total int64
	err := filepath.WalkDir(a.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		id, _, _ := strings.Cut(d.Name(), ".")
		files = append(files, file{p, id, fi.ModTime(), fi.Size()})
		total += fi.Size()
		return nil
	})
	if err != nil {
		return err
	}
	slices.SortFunc(files, func(x, y file) int { return x.mod.Compare(y.mod) })
	cutoff := time.Now().Add(-maxAge)
	for _, f := range files {
		if keep(f.id) || (f.mod.After(cutoff) && total <= maxTotal) {
			continue
		}
		if fh := a.files[f.id]; fh != nil {
			fh.Close()
			delete(a.files, f.id)
		}
		if err := os.Remove(f.path); err == nil {
			total -= f.size
		}
	}
	return nil
}
