// Package codeinterp is Warren's code interpreter: the HTTP server on port
// 49999 of a code-interpreter sandbox that E2B's `@e2b/code-interpreter`
// SDKs talk to (GET /health, POST /execute streaming JSON lines, /contexts).
//
// A Python or R context is one Jupyter kernel (ipykernel, IRkernel)
// started by a small Python bridge of Warren's own (bridge.py, embedded
// here and written into a root-owned directory at start, with
// formatters.py: the IPython formatters of E2B's e2b/data and e2b/chart
// results) that speaks Jupyter's messaging protocol with Debian's
// jupyter_client and JSON lines with this server over its stdin and
// stdout. A bridge rather than ZeroMQ from Go: jupyter_client is the
// protocol's reference client and is packaged by Debian, while Go's
// ZeroMQ libraries are either cgo (no static envd) or young; the bridge
// costs one small process per context. A bash context is one long-lived
// bash, a JavaScript or TypeScript context one long-lived Node
// (jsrunner.js; TypeScript compiled by Debian's tsc, types stripped as
// E2B's kernel does), each behind the same bridge and protocol.
//
// envd runs this server in-process (cmd/envd) when the sandbox's image has
// the marker file MarkerPath: envd holds the access token that /execute
// checks (and that the platform may rotate), runs as root and starts the
// bridges as the sandbox's user, so a cell cannot kill the server.
//
// One execution runs at a time per context (others wait their turn); a
// client that goes away interrupts the kernel (SIGINT) and its output is
// drained before the next execution starts; every execution's output is
// bounded (Config.MaxOutputBytes, Config.MaxLineBytes).
package codeinterp

import (
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/envd/users"
)

// Port is the code interpreter's port, E2B's.
const Port = 49999

// MarkerPath is the file whose presence in a sandbox's image makes envd
// serve the code interpreter (the code-interpreter-v1 template has it, and
// so has every template built from it).
const MarkerPath = "/etc/warren/code-interpreter"

// RunDir is where envd runs the code interpreter (Config.RunDir).
const RunDir = "/run/warren-codeinterp"

// DefaultReadyPath is the file envd writes once the default Python
// kernel it starts at boot is ready: a template's start snapshot waits
// for it, so that restored sandboxes hold a running kernel.
const DefaultReadyPath = RunDir + "/default-kernel-ready"

//go:embed bridge.py
var bridgeScript []byte

//go:embed formatters.py
var formattersScript []byte

//go:embed jsrunner.js
var jsRunnerScript []byte

// Config configures a Server.
type Config struct {
	// Python runs the bridge: an interpreter with jupyter_client and
	// ipykernel. Default /usr/bin/python3.
	Python string
	// User runs the kernels; nil means this process's user.
	User *users.User
	// Env returns the sandbox's environment variables, which every new
	// kernel gets (on top of PATH, HOME, USER, LANG).
	Env func() map[string]string
	// Authorize checks /execute's X-Access-Token; nil allows every request.
	Authorize func(token string) bool
	// Start starts a command and returns its pid and a channel closed when
	// it has exited (envd: its reaper). Default: cmd.Start and cmd.Wait.
	Start func(cmd *exec.Cmd) (pid int, done <-chan struct{}, err error)
	// RunDir holds the bridge script and the contexts' directories; it is
	// created (0711) if missing. Default: a new directory in os.TempDir.
	RunDir string
	// DefaultCwd is a new context's working directory when none is given;
	// default: the user's home.
	DefaultCwd string
	// MaxContexts bounds the contexts (kernels) alive at once; default 32.
	MaxContexts int
	// MaxOutputBytes bounds one execution's output (the bytes of its
	// stdout, stderr and result lines); beyond it, output events are
	// dropped, with one note on stderr (errors and the end still come).
	// Default 64 MiB.
	MaxOutputBytes int
	// MaxLineBytes bounds one output event (a result with its images);
	// a larger one is replaced by a note on stderr. It is also the most
	// this server holds of one execution's output at a time: a stream's
	// text comes in events of a few kilobytes. Default 16 MiB.
	MaxLineBytes int
	// StartTimeout bounds a kernel's start; default 2 minutes.
	StartTimeout time.Duration
	// Keepalive is the interval of keepalive lines while a cell runs;
	// default 5 s.
	Keepalive time.Duration
	// DrainTimeout bounds how long an interrupted cell (its client gone) may
	// take to stop before its kernel is killed; default 10 s.
	DrainTimeout time.Duration
	// MaxUserProcesses is the RLIMIT_NPROC of every bridge and kernel: the
	// tasks (threads included) the user may have in the whole sandbox
	// before a kernel's fork fails. It keeps a fork bomb in a cell from
	// exhausting the sandbox (and the host's tasks: each guest process is
	// a few host tasks under gVisor) while leaving room for a process pool.
	// Default 512; negative leaves the limit as inherited.
	MaxUserProcesses int
	// MemoryCheckInterval is how often the memory guard reads the guest's
	// memory (every 10 ms once it runs low); default 100 ms; negative
	// turns the guard off.
	MemoryCheckInterval time.Duration
	// MemoryReserve is the available memory (bytes) below which the guard
	// kills the kernel that holds the most; default 1/8 of the guest's
	// memory, at least 64 MiB.
	MemoryReserve uint64
	// ProcDir is the proc file system the guard reads; default /proc.
	ProcDir string
	Log     *slog.Logger
}

// Server is the code interpreter's HTTP handler and its contexts.
type Server struct {
	cfg        Config
	runDir     string
	bridgePath string
	mux        *http.ServeMux

	mu       sync.Mutex
	contexts map[string]*execContext
	defaults map[string]string // language → its default context's ID
	closed   bool
	done     chan struct{} // closed by Close

	// The memory guard's view of the guest (fakes in tests).
	memInfo func() (memInfo, error)
	procs   func() ([]procInfo, error)
	signal  func(pid int, sig syscall.Signal) error
	now     func() time.Time
}

// New prepares a server; Start its default context with StartDefault.
func New(cfg Config) (*Server, error) {
	if cfg.Python == "" {
		cfg.Python = "/usr/bin/python3"
	}
	if cfg.Env == nil {
		cfg.Env = func() map[string]string { return nil }
	}
	if cfg.Start == nil {
		cfg.Start = startAndWait
	}
	if cfg.MaxContexts <= 0 {
		cfg.MaxContexts = 32
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = 64 << 20
	}
	if cfg.MaxLineBytes <= 0 {
		cfg.MaxLineBytes = 16 << 20
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = 5 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxUserProcesses == 0 {
		cfg.MaxUserProcesses = 512
	}
	if cfg.MemoryCheckInterval == 0 {
		cfg.MemoryCheckInterval = 100 * time.Millisecond
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	if cfg.DefaultCwd == "" {
		cfg.DefaultCwd = "/"
		if cfg.User != nil && cfg.User.Home != "" {
			cfg.DefaultCwd = cfg.User.Home
		} else if h, err := os.UserHomeDir(); err == nil {
			cfg.DefaultCwd = h
		}
	}
	dir := cfg.RunDir
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", "warren-codeinterp-")
	} else {
		err = os.MkdirAll(dir, 0o711)
	}
	if err != nil {
		return nil, fmt.Errorf("codeinterp: run dir: %w", err)
	}
	// Others may pass through (the user's context dirs are inside) but
	// not list or write: the bridge script is root's.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, fmt.Errorf("codeinterp: run dir: %w", err)
	}
	for name, content := range map[string][]byte{"bridge.py": bridgeScript, "formatters.py": formattersScript, "jsrunner.js": jsRunnerScript} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p+".tmp", content, 0o644); err != nil {
			return nil, fmt.Errorf("codeinterp: writing %s: %w", name, err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return nil, fmt.Errorf("codeinterp: writing %s: %w", name, err)
		}
	}
	bridge := filepath.Join(dir, "bridge.py")
	s := &Server{cfg: cfg, runDir: dir, bridgePath: bridge, contexts: map[string]*execContext{}, defaults: map[string]string{}, done: make(chan struct{})}
	s.memInfo = func() (memInfo, error) { return readMemInfo(filepath.Join(cfg.ProcDir, "meminfo")) }
	s.procs = func() ([]procInfo, error) { return readProcs(cfg.ProcDir) }
	s.signal = syscall.Kill
	s.now = time.Now
	if cfg.MemoryCheckInterval > 0 {
		go s.guardMemory()
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.HandleFunc("POST /execute", s.execute)
	s.mux.HandleFunc("POST /contexts", s.createContext)
	s.mux.HandleFunc("GET /contexts", s.listContexts)
	s.mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	s.mux.HandleFunc("DELETE /contexts/{id}", s.removeContext)
	return s, nil
}

func startAndWait(cmd *exec.Cmd) (int, <-chan struct{}, error) {
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return cmd.Process.Pid, done, nil
}

// StartDefault starts the default Python context, whose kernel then waits
// for the first cell.
func (s *Server) StartDefault() error {
	c, err := s.defaultContext("python")
	if err != nil {
		return err
	}
	_, err = c.ensureKernel(s)
	return err
}

// Close ends every context's kernel.
func (s *Server) Close() {
	s.mu.Lock()
	if !s.closed {
		close(s.done)
	}
	s.closed = true
	cs := s.contexts
	s.contexts = map[string]*execContext{}
	s.mu.Unlock()
	for _, c := range cs {
		c.remove("the code interpreter stopped")
	}
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			s.cfg.Log.Error("codeinterp: panic", "panic", v, "path", r.URL.Path)
		}
	}()
	s.mux.ServeHTTP(w, r)
}

// environ is a new kernel's environment, and the sandbox's variables in it.
func (s *Server) environ() ([]string, map[string]string) {
	env := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG": "C.UTF-8",
		// The kernel's own output goes nowhere; Python's buffering would
		// only delay what a cell's subprocesses print.
		"PYTHONUNBUFFERED": "1",
	}
	if u := s.cfg.User; u != nil {
		env["HOME"], env["USER"], env["LOGNAME"] = u.Home, u.Name, u.Name
	} else if h, err := os.UserHomeDir(); err == nil {
		env["HOME"] = h
	}
	sandboxEnv := s.cfg.Env()
	for k, v := range sandboxEnv {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out, maps.Clone(sandboxEnv)
}

// Languages the contexts speak, by the names the SDK may send.
func normalizeLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

var supported = map[string]bool{"python": true, "r": true, "bash": true, "javascript": true, "typescript": true}

// execContext is one context: a kernel, started on demand, and the turn
// of its executions.
type execContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	turn chan struct{} // holds a token while an execution runs

	mu      sync.Mutex // guards k and its (re)start
	k       *kernel
	removed bool
}

func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

var (
	errTooMany  = errors.New("too many contexts")
	errNotFound = errors.New("context not found")
	errClosed   = errors.New("the code interpreter is stopping")
)

// newContext registers a context (its kernel starts on first use).
func (s *Server) newContext(language, cwd string) (*execContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if len(s.contexts) >= s.cfg.MaxContexts {
		return nil, fmt.Errorf("%w: at most %d contexts may exist at once; remove one first", errTooMany, s.cfg.MaxContexts)
	}
	c := &execContext{ID: newID(), Language: language, Cwd: cwd, turn: make(chan struct{}, 1)}
	s.contexts[c.ID] = c
	return c, nil
}

func (s *Server) forget(c *execContext) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.contexts[c.ID] == c {
		delete(s.contexts, c.ID)
	}
	for l, id := range s.defaults {
		if id == c.ID {
			delete(s.defaults, l)
		}
	}
}

func (s *Server) lookup(id string) (*execContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.contexts[id]; ok {
		return c, nil
	}
	return nil, errNotFound
}

// defaultContext is language's default context, made on first use.
func (s *Server) defaultContext(language string) (*execContext, error) {
	s.mu.Lock()
	if id, ok := s.defaults[language]; ok {
		c := s.contexts[id]
		s.mu.Unlock()
		return c, nil
	}
	s.mu.Unlock()
	c, err := s.newContext(language, s.cfg.DefaultCwd)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.defaults[language]; ok { // another request made it meanwhile
		delete(s.contexts, c.ID)
		return s.contexts[id], nil
	}
	s.defaults[language] = c.ID
	return c, nil
}

// ensureKernel returns the context's kernel, starting one if it has none
// or its last one died.
func (c *execContext) ensureKernel(s *Server) (*kernel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil, errNotFound
	}
	if c.k != nil && c.k.alive() {
		return c.k, nil
	}
	if c.k != nil {
		c.k.kill()
		c.k = nil
	}
	k, err := s.startKernel(c.ID, c.Language, c.Cwd)
	if err != nil {
		return nil, err
	}
	c.k = k
	return k, nil
}

// restart kills the context's kernel (a running execution ends with an
// error) and starts a new one.
func (c *execContext) restart(s *Server) error {
	c.mu.Lock()
	if c.removed {
		c.mu.Unlock()
		return errNotFound
	}
	old := c.k
	if old != nil {
		old.killWith("ContextRestarting")
		c.k = nil
	}
	c.mu.Unlock()
	// The old kernel's processes (a fork bomb's among them) go first:
	// they hold the user's processes and memory that the new one needs.
	if old != nil && !old.waitGone(groupKillTimeout) {
		s.cfg.Log.Warn("codeinterp: a restarted context's old processes are still alive", "context", c.ID, "pgid", old.pid)
	}
	_, err := c.ensureKernel(s)
	return err
}

// killKernel kills the context's kernel if its process group is still
// pgid (the memory guard chose it); a running execution ends with reason.
func (c *execContext) killKernel(pgid int, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.k != nil && c.k.pid == pgid {
		c.k.killWith(reason)
	}
}

func (c *execContext) remove(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed = true
	if c.k != nil {
		c.k.killWith(reason)
		c.k = nil
	}
}

// ---- HTTP ----

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, "OK")
}

type createContextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var req createContextRequest
	if !decodeBody(w, r, 64<<10, &req) {
		return
	}
	language := normalizeLanguage(req.Language)
	if !supported[language] {
		plain(w, http.StatusBadRequest, fmt.Sprintf("Language %q is not supported (supported: python, r, javascript, typescript, bash)", req.Language))
		return
	}
	cwd, err := s.checkCwd(req.Cwd)
	if err != nil {
		plain(w, http.StatusBadRequest, err.Error())
		return
	}
	c, err := s.newContext(language, cwd)
	if err != nil {
		plain(w, statusOf(err), err.Error())
		return
	}
	if _, err := c.ensureKernel(s); err != nil {
		c.remove("")
		s.forget(c)
		plain(w, statusOf(err), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// checkCwd validates a context's working directory: an absolute path
// without NUL, cleaned. Whether the user may use it is the bridge's to find
// out, as that user: this server (root) never looks inside the sandbox's
// tree on a tenant's behalf.
func (s *Server) checkCwd(cwd string) (string, error) {
	if cwd == "" {
		return s.cfg.DefaultCwd, nil
	}
	if len(cwd) > 4096 || strings.ContainsRune(cwd, 0) {
		return "", errors.New("cwd must be a path of at most 4096 bytes without NUL")
	}
	if !filepath.IsAbs(cwd) {
		return "", fmt.Errorf("cwd %q must be an absolute path", cwd)
	}
	return filepath.Clean(cwd), nil
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	out := make([]*execContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		out = append(out, c)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c, err := s.lookup(id)
	if err != nil {
		plain(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", id))
		return
	}
	if err := c.restart(s); err != nil {
		plain(w, statusOf(err), fmt.Sprintf("Failed to restart context %s: %v", id, err))
		return
	}
	writeJSON(w, http.StatusOK, nil)
}

func (s *Server) removeContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c, err := s.lookup(id)
	if err != nil {
		plain(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", id))
		return
	}
	c.remove("ContextRemoved")
	s.forget(c)
	writeJSON(w, http.StatusOK, nil)
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, errNotFound):
		return http.StatusNotFound
	case errors.Is(err, errTooMany):
		return http.StatusTooManyRequests
	case errors.Is(err, errClosed):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// plain answers an error as E2B's server does: its text, as text.
func plain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprint(w, msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeBody reads a JSON body of at most max bytes into v; an empty body
// is an empty object. It answers 400 itself and returns false on bad input.
func decodeBody(w http.ResponseWriter, r *http.Request, max int64, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, max)
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			plain(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", max))
			return false
		}
		plain(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return false
	}
	return true
}
