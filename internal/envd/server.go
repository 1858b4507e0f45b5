// Package envd assembles the in-sandbox daemon: the E2B Connect services
// (filesystem.Filesystem, process.Process), the plain HTTP endpoints
// (/files, /health, /envs, /init, /metrics) and access-token auth in front of
// them. It listens on port 49983 inside every sandbox.
package envd

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/envd/files"
	"github.com/warren-sandbox/warren/internal/envd/filesystem"
	"github.com/warren-sandbox/warren/internal/envd/process"
	"github.com/warren-sandbox/warren/internal/envd/reaper"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/proto/envd/filesystem/filesystemconnect"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// Server is envd's HTTP handler plus the resources it owns.
type Server struct {
	settings *settings.Settings
	fs       *filesystem.Service
	proc     *process.Service
	metrics  *metricsSampler
	mux      *http.ServeMux
	log      *slog.Logger
}

// New builds the daemon. r must be started before any process is run.
func New(s *settings.Settings, r *reaper.Reaper, log *slog.Logger) *Server {
	srv := &Server{
		settings: s,
		fs:       filesystem.NewService(s),
		proc:     process.NewService(s, r),
		metrics:  newMetricsSampler(),
		mux:      http.NewServeMux(),
		log:      log,
	}
	fsPath, fsHandler := filesystemconnect.NewFilesystemHandler(srv.fs)
	procPath, procHandler := processconnect.NewProcessHandler(srv.proc)
	srv.mux.Handle(fsPath, srv.requireToken(fsHandler))
	srv.mux.Handle(procPath, srv.requireToken(procHandler))
	// /files checks the token or a URL signature itself; /files/compose
	// takes the token only.
	fh := files.NewHandler(s)
	srv.mux.Handle("/files", fh)
	srv.mux.Handle("/files/compose", srv.requireToken(fh))
	srv.mux.Handle("GET /envs", srv.requireToken(http.HandlerFunc(srv.handleEnvs)))
	srv.mux.Handle("GET /metrics", srv.requireToken(http.HandlerFunc(srv.handleMetrics)))
	// /init is the platform's: it needs the current token, like the rest.
	srv.mux.Handle("POST /init", srv.requireToken(http.HandlerFunc(srv.handleInit)))
	return srv
}

// ServeHTTP implements http.Handler. Cross-origin calls get CORS
// headers and preflights their answer (cors.go). GET (and HEAD) /health is always open (the
// platform polls it before it can authenticate); every other request,
// including unknown paths, is refused while envd has no token to check it
// against, unless it runs with --insecure-no-token.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if cors(w, r) { // a preflight carries no token
		return
	}
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if s.settings.AccessToken() == "" && !s.settings.Open() {
		WriteError(w, http.StatusUnauthorized, "envd has no access token yet: every request but GET /health is refused")
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Close stops watchers and releases what the services hold. Running
// processes are left alone: they belong to the sandbox, not to the server.
func (s *Server) Close() {
	s.fs.Close()
}

// Processes exposes the process service, for signal forwarding at shutdown.
func (s *Server) Processes() *process.Service { return s.proc }

// requireToken passes requests that carry the access token in
// X-Access-Token (or any request when envd is open, see settings.Open).
func (s *Server) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.settings.Open() && !s.settings.TokenMatches(r.Header.Get("X-Access-Token")) {
			WriteError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or method signing if supported")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// WriteError writes envd's JSON error body {"code","message"}.
func WriteError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

func (s *Server) handleEnvs(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.settings.EnvVars())
}

// initRequest is the body of POST /init (wire contract §6.5).
type initRequest struct {
	EnvVars        map[string]string `json:"envVars"`
	AccessToken    *string           `json:"accessToken"`
	DefaultUser    *string           `json:"defaultUser"`
	DefaultWorkdir *string           `json:"defaultWorkdir"`
	Timestamp      *time.Time        `json:"timestamp"`
}

func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	var req initRequest
	body := http.MaxBytesReader(w, r.Body, 1<<20)
	if err := json.NewDecoder(body).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		WriteError(w, http.StatusBadRequest, "invalid init body: "+err.Error())
		return
	}
	if req.AccessToken != nil && *req.AccessToken == "" {
		// An empty token would lock everyone out (or, with
		// --insecure-no-token, let everyone in).
		WriteError(w, http.StatusBadRequest, "accessToken must not be empty")
		return
	}
	s.settings.Apply(settings.Update{
		AccessToken: req.AccessToken,
		User:        req.DefaultUser,
		Workdir:     req.DefaultWorkdir,
		EnvVars:     req.EnvVars,
	})
	if req.Timestamp != nil {
		s.syncClock(*req.Timestamp)
	}
	w.WriteHeader(http.StatusNoContent)
}

// syncClock sets the sandbox clock after a restore from a snapshot, where
// the guest's time stands still while it is not running. Only PID 1 (a real
// sandbox) touches the clock; a development envd never changes the host's.
func (s *Server) syncClock(t time.Time) {
	if os.Getpid() != 1 {
		return
	}
	if d := time.Since(t); d > -time.Second && d < time.Second {
		return
	}
	tv := unix.NsecToTimeval(t.UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		s.log.Warn("clock sync failed", "err", err)
	}
}
