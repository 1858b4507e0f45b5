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
	"sync/atomic"
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
// sandbox holds at most twice that), written by one goroutine from a
// bounded queue so that no connection waits for the disk. Entries that
// find the queue full are counted and reported in the next line written.
// Files outlive their sandbox (the audit is most wanted afterwards);
// Sweep bounds their age and total size.
type Audit struct {
	dir     string
	maxFile int64
	queue   chan auditItem
	dropped atomic.Int64
	done    chan struct{}
	log     *slog.Logger

	mu    sync.Mutex // file operations: the writer's rotation, readers
	files map[string]*os.File
}

type auditItem struct {
	e     Entry
	flush chan struct{}
}

// DefaultAuditFileBytes is a sandbox's audit file size before rotation.
const DefaultAuditFileBytes = 1 << 20

const auditQueue = 4096

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
	a := &Audit{dir: dir, maxFile: maxFile, queue: make(chan auditItem, auditQueue), done: make(chan struct{}),
		log: log, files: map[string]*os.File{}}
	go a.write()
	return a, nil
}

// Log queues an entry; it never blocks.
func (a *Audit) Log(e Entry) {
	if a == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	select {
	case a.queue <- auditItem{e: e}:
	default:
		a.dropped.Add(1)
	}
}

// Flush waits until everything queued before it is written.
func (a *Audit) Flush() {
	if a == nil {
		return
	}
	f := make(chan struct{})
	a.queue <- auditItem{flush: f}
	<-f
}

// Close writes what is queued and stops the writer.
func (a *Audit) Close() {
	if a == nil {
		return
	}
	close(a.queue)
	<-a.done
}

var auditName = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

func (a *Audit) write() {
	defer close(a.done)
	defer func() {
		a.mu.Lock()
		for _, f := range a.files {
			f.Close()
		}
		a.mu.Unlock()
	}()
	for it := range a.queue {
		if it.flush != nil {
			close(it.flush)
			continue
		}
		if n := a.dropped.Swap(0); n > 0 {
			it.e.Reason = strings.TrimSpace(fmt.Sprintf("%s (%d earlier entries of the node were dropped: the audit queue was full)", it.e.Reason, n))
		}
		if err := a.append(it.e); err != nil {
			a.log.Warn("egress audit: writing an entry", "sandbox", it.e.Sandbox, "err", err)
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
