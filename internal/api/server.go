// Package api serves Warren's platform API, the E2B-compatible REST API
// described by api/openapi.yml, whose server interface and types are
// generated into internal/api/gen.
//
// This package does HTTP only: authentication (X-API-Key, or an access
// token as Authorization: Bearer), decoding and validating requests,
// E2B's error bodies ({"code": status, "message"}; many SDK call sites read
// the code from the body, not the status), pagination and encoding. What
// happens to sandboxes is internal/sandbox's.
package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/build"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// Timeouts a create request gets when it names none: the seed's 15 s on
// POST /sandboxes, and 300 s on POST /v2/sandboxes, which is what E2B's
// API does and what SDK 2.51 (which omits the field) relies on.
const (
	DefaultTimeoutV1 = 15 * time.Second
	DefaultTimeoutV2 = 300 * time.Second
	// MaxTimeout bounds every timeout a client asks for.
	MaxTimeout = 24 * time.Hour
	// defaultRefresh and maxRefresh bound POST .../refreshes.
	defaultRefresh = 60 * time.Second
	maxRefresh     = time.Hour
	maxBody        = 1 << 20
)

// Config wires a Server.
type Config struct {
	Store     store.Store
	Sandboxes Sandboxes
	// Templates builds and keeps templates.
	Templates Templates
	// ClientID is what the deprecated clientID field says (the node name).
	ClientID string
	Logger   *slog.Logger
}

// Server implements gen.ServerInterface.
type Server struct {
	cfg Config
	log *slog.Logger
}

var _ gen.ServerInterface = (*Server)(nil)

// New returns the API's HTTP handler.
func New(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "warren"
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.EscapedPath()))
	})
	h := gen.HandlerWithOptions(s, gen.StdHTTPServerOptions{
		BaseRouter: mux,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadRequest, err.Error())
		},
	})
	return s.recoverPanics(s.authenticate(s.routeAlias(h)))
}

// routeAlias serves GET /templates/aliases/{alias}, which the generated
// router cannot hold beside GET /templates/{templateID}/tags.
func (s *Server) routeAlias(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if alias, ok := strings.CutPrefix(r.URL.Path, "/templates/aliases/"); ok && r.Method == http.MethodGet && alias != "" && !strings.Contains(alias, "/") {
			s.GetTemplateAlias(w, r, alias)
			return
		}
		next.ServeHTTP(w, r)
	})
}

type teamKey struct{}

func teamOf(r *http.Request) string { t, _ := r.Context().Value(teamKey{}).(string); return t }

// authenticate resolves the caller's team from X-API-Key, or from an
// access token in Authorization: Bearer. Only /health and template file
// uploads (whose URLs are signed) are open.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || (r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, build.UploadPathPrefix)) {
			next.ServeHTTP(w, r)
			return
		}
		kind, secret := store.KindAPIKey, r.Header.Get("X-API-Key")
		if secret == "" {
			if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
				kind, secret = store.KindAccessToken, strings.TrimSpace(h[7:])
			}
		}
		if secret == "" {
			writeError(w, http.StatusUnauthorized, "missing credentials: send an API key in the X-API-Key header (or an access token as Authorization: Bearer)")
			return
		}
		key, err := auth.Authenticate(r.Context(), s.cfg.Store, kind, secret)
		if errors.Is(err, auth.ErrUnauthorized) {
			writeError(w, http.StatusUnauthorized, "invalid API key or access token")
			return
		}
		if err != nil {
			s.internal(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), teamKey{}, key.TeamID)))
	})
}

// recoverPanics turns a handler's panic into a 500 with E2B's body.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic in API handler", "method", r.Method, "path", r.URL.Path, "panic", v)
				writeError(w, http.StatusInternalServerError, "internal server error")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, gen.Error{Code: int32(status), Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Error("API request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "internal server error: "+err.Error())
}

// fail maps the sandbox manager's errors to statuses.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, sandbox.ErrTemplateNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, sandbox.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, sandbox.ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, sandbox.ErrTeamLimit):
		writeError(w, http.StatusTooManyRequests, err.Error())
	case errors.Is(err, sandbox.ErrNoCapacity):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client is gone; nobody reads the answer.
		writeError(w, 499, "client closed request")
	default:
		s.internal(w, r, err)
	}
}

// decode reads a JSON body into v. Unknown fields are allowed (the SDK
// sends some); an empty body leaves v as it is when optional.
func decode(r *http.Request, v any, optional bool) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if len(data) > maxBody {
		return fmt.Errorf("the body is larger than %d bytes", maxBody)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		if optional {
			return nil
		}
		return errors.New("a JSON body is required")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	return nil
}

// seconds turns a request's timeout into a duration, or the default.
func seconds(v *int32, def time.Duration, field string) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	d := time.Duration(*v) * time.Second
	if *v < 0 || d > MaxTimeout {
		return 0, fmt.Errorf("%s must be between 0 and %d seconds", field, int(MaxTimeout.Seconds()))
	}
	return d, nil
}

func (s *Server) Health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, gen.Health{Status: "ok"})
}

func (s *Server) CreateSandbox(w http.ResponseWriter, r *http.Request) {
	s.create(w, r, DefaultTimeoutV1)
}

func (s *Server) CreateSandboxV2(w http.ResponseWriter, r *http.Request) {
	s.create(w, r, DefaultTimeoutV2)
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, defTimeout time.Duration) {
	var body gen.NewSandbox
	if err := decode(r, &body, false); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	timeout, err := seconds(body.Timeout, defTimeout, "timeout")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	req := sandbox.CreateRequest{
		TeamID: teamOf(r), TemplateID: body.TemplateID, Timeout: timeout,
		Metadata: map[string]string(deref(body.Metadata)), EnvVars: map[string]string(deref(body.EnvVars)),
		AutoPause: deref(body.AutoPause), Secure: true, AllowInternetAccess: body.AllowInternetAccess,
	}
	if body.AutoResume != nil {
		req.AutoResume = deref(body.AutoResume.Enabled)
	}
	if n := body.Network; n != nil {
		req.Extra.Network = &sandbox.Network{
			AllowPublicTraffic: n.AllowPublicTraffic, AllowOut: deref(n.AllowOut), DenyOut: deref(n.DenyOut),
			MaskRequestHost: deref(n.MaskRequestHost),
		}
	}
	if body.VolumeMounts != nil {
		for _, v := range *body.VolumeMounts {
			req.Extra.VolumeMounts = append(req.Extra.VolumeMounts, sandbox.VolumeMount{Name: v.Name, Path: v.Path})
		}
	}
	if body.Mcp != nil {
		req.Extra.MCP = *body.Mcp
	}
	rec, err := s.cfg.Sandboxes.Create(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxOf(rec))
}

func (s *Server) sandboxOf(rec store.Sandbox) gen.Sandbox {
	return gen.Sandbox{
		TemplateID: rec.TemplateID, SandboxID: rec.ID, ClientID: s.cfg.ClientID, EnvdVersion: rec.EnvdVersion,
		Alias: nonEmpty(rec.Alias), EnvdAccessToken: nonEmpty(rec.EnvdAccessToken), TrafficAccessToken: nonEmpty(rec.TrafficAccessToken),
	}
}

func (s *Server) listedOf(rec store.Sandbox) gen.ListedSandbox {
	l, _ := s.listedAndExtra(rec)
	return l
}

// listedAndExtra also returns the record's Extra, which it had to read.
func (s *Server) listedAndExtra(rec store.Sandbox) (gen.ListedSandbox, sandbox.Extra) {
	ex := sandbox.ParseExtra(rec.Extra)
	meta := gen.StringMap(rec.Metadata)
	if meta == nil {
		meta = gen.StringMap{}
	}
	mounts := []gen.VolumeMount{}
	for _, v := range ex.VolumeMounts {
		mounts = append(mounts, gen.VolumeMount{Name: v.Name, Path: v.Path})
	}
	return gen.ListedSandbox{
		TemplateID: rec.TemplateID, SandboxID: rec.ID, ClientID: s.cfg.ClientID, Alias: nonEmpty(rec.Alias),
		StartedAt: rec.StartedAt.UTC(), EndAt: rec.EndAt.UTC(),
		CpuCount: int32(rec.CPUCount), MemoryMB: int32(rec.MemoryMB), DiskSizeMB: int32(rec.DiskSizeMB),
		EnvdVersion: rec.EnvdVersion, State: gen.SandboxState(rec.State), Metadata: &meta, VolumeMounts: &mounts,
	}, ex
}

func (s *Server) GetSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	rec, err := s.cfg.Sandboxes.Get(r.Context(), teamOf(r), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	l, ex := s.listedAndExtra(rec)
	d := gen.SandboxDetail{
		TemplateID: l.TemplateID, SandboxID: l.SandboxID, ClientID: l.ClientID, Alias: l.Alias,
		StartedAt: l.StartedAt, EndAt: l.EndAt, CpuCount: l.CpuCount, MemoryMB: l.MemoryMB, DiskSizeMB: l.DiskSizeMB,
		EnvdVersion: l.EnvdVersion, State: l.State, Metadata: l.Metadata, VolumeMounts: l.VolumeMounts,
		EnvdAccessToken: nonEmpty(rec.EnvdAccessToken), AllowInternetAccess: rec.AllowInternetAccess,
	}
	onTimeout := gen.Kill
	if rec.AutoPause {
		onTimeout = gen.Pause
	}
	d.Lifecycle = &gen.SandboxLifecycle{AutoResume: rec.AutoResume, OnTimeout: onTimeout}
	if n := ex.Network; n != nil {
		d.Network = &gen.SandboxNetworkConfig{AllowPublicTraffic: n.AllowPublicTraffic, AllowOut: &n.AllowOut, DenyOut: &n.DenyOut, MaskRequestHost: nonEmpty(n.MaskRequestHost)}
	}
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) ListSandboxes(w http.ResponseWriter, r *http.Request, params gen.ListSandboxesParams) {
	meta, err := parseMetadata(params.Metadata)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	recs, err := s.cfg.Sandboxes.List(r.Context(), teamOf(r), store.SandboxFilter{
		Metadata: meta, States: []store.SandboxState{store.StateRunning}, Desc: true,
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]gen.ListedSandbox, 0, len(recs))
	for _, rec := range recs {
		out = append(out, s.listedOf(rec))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) ListSandboxesV2(w http.ResponseWriter, r *http.Request, params gen.ListSandboxesV2Params) {
	meta, err := parseMetadata(params.Metadata)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	f := store.SandboxFilter{Metadata: meta, Desc: true, Limit: 100}
	if params.State != nil {
		for _, st := range *params.State {
			if st != gen.Running && st != gen.Paused {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid state %q: want running or paused", st))
				return
			}
			f.States = append(f.States, store.SandboxState(st))
		}
	}
	if params.StartedAfter != nil {
		f.StartedAfter = *params.StartedAfter
	}
	if params.Template != nil {
		f.TemplateID = *params.Template
	}
	if params.Order != nil {
		switch *params.Order {
		case gen.Asc:
			f.Desc = false
		case gen.Desc:
		default:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid order %q: want asc or desc", *params.Order))
			return
		}
	}
	if params.Limit != nil {
		if *params.Limit < 1 || *params.Limit > 100 {
			writeError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		f.Limit = int(*params.Limit)
	}
	if params.NextToken != nil && *params.NextToken != "" {
		c, desc, err := parseToken(*params.NextToken)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		f.After, f.Desc = &c, desc
	}
	limit := f.Limit
	f.Limit++ // one more tells whether there is a next page
	recs, err := s.cfg.Sandboxes.List(r.Context(), teamOf(r), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(recs) > limit {
		recs = recs[:limit]
		last := recs[limit-1]
		w.Header().Set("X-Next-Token", makeToken(store.Cursor{StartedAt: last.StartedAt, ID: last.ID}, f.Desc))
	}
	out := make([]gen.ListedSandbox, 0, len(recs))
	for _, rec := range recs {
		out = append(out, s.listedOf(rec))
	}
	writeJSON(w, http.StatusOK, out)
}

// makeToken encodes a listing position, and its order, as an opaque
// token: base64url of "<RFC 3339 time>__<id>[__asc]".
func makeToken(c store.Cursor, desc bool) string {
	s := c.StartedAt.UTC().Format(time.RFC3339Nano) + "__" + c.ID
	if !desc {
		s += "__asc"
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

func parseToken(tok string) (store.Cursor, bool, error) {
	bad := fmt.Errorf("invalid nextToken %q", tok)
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(tok, "="))
	if err != nil {
		return store.Cursor{}, false, bad
	}
	parts := strings.Split(string(raw), "__")
	if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "asc") {
		return store.Cursor{}, false, bad
	}
	t, err := time.Parse(time.RFC3339Nano, parts[0])
	if err != nil || parts[1] == "" {
		return store.Cursor{}, false, bad
	}
	return store.Cursor{StartedAt: t, ID: parts[1]}, len(parts) == 2, nil
}

// parseMetadata decodes the metadata filter as the SDK encodes it: a
// query string of pairs whose keys and values are percent-encoded once
// more (wire contract §3.2).
func parseMetadata(p *string) (map[string]string, error) {
	if p == nil || *p == "" {
		return nil, nil
	}
	q, err := url.QueryUnescape(*p)
	if err != nil {
		return nil, fmt.Errorf("invalid metadata filter: %w", err)
	}
	out := map[string]string{}
	for _, pair := range strings.Split(q, "&") {
		kv := strings.Split(pair, "=")
		if len(kv) != 2 {
			return nil, fmt.Errorf("invalid metadata filter %q: want key=value pairs joined by &", *p)
		}
		k, err1 := url.QueryUnescape(kv[0])
		v, err2 := url.QueryUnescape(kv[1])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("invalid metadata filter: %w", err)
		}
		out[k] = v
	}
	return out, nil
}

func (s *Server) KillSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	if err := s.cfg.Sandboxes.Kill(r.Context(), teamOf(r), id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) SetSandboxTimeout(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body struct {
		Timeout *int32 `json:"timeout"`
	}
	if err := decode(r, &body, false); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.Timeout == nil {
		writeError(w, http.StatusBadRequest, "timeout is required")
		return
	}
	d, err := seconds(body.Timeout, 0, "timeout")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.cfg.Sandboxes.SetTimeout(r.Context(), teamOf(r), id, d); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) RefreshSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body gen.RefreshSandboxJSONBody
	if err := decode(r, &body, true); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	d := defaultRefresh
	if body.Duration != nil {
		d = time.Duration(*body.Duration) * time.Second
		if *body.Duration < 0 || d > maxRefresh {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("duration must be between 0 and %d seconds", int(maxRefresh.Seconds())))
			return
		}
	}
	if err := s.cfg.Sandboxes.Refresh(r.Context(), teamOf(r), id, d); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) ConnectSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	s.connect(w, r, id, DefaultTimeoutV1)
}

func (s *Server) ConnectSandboxV2(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	s.connect(w, r, id, DefaultTimeoutV2)
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request, id string, defTimeout time.Duration) {
	var body gen.ConnectSandbox
	if err := decode(r, &body, true); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	timeout, err := seconds(body.Timeout, defTimeout, "timeout")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rec, resumed, err := s.cfg.Sandboxes.Connect(r.Context(), teamOf(r), id, timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sandboxOf(rec))
}

func (s *Server) GetSandboxMetrics(w http.ResponseWriter, r *http.Request, id gen.SandboxID, params gen.GetSandboxMetricsParams) {
	var start, end time.Time
	if params.Start != nil {
		start = time.Unix(*params.Start, 0)
	}
	if params.End != nil {
		end = time.Unix(*params.End, 0).Add(time.Second - 1) // the whole second
	}
	ms, err := s.cfg.Sandboxes.Metrics(r.Context(), teamOf(r), id, start, end)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]gen.SandboxMetric, 0, len(ms))
	for _, m := range ms {
		out = append(out, gen.SandboxMetric{
			Timestamp: m.Time.UTC(), TimestampUnix: m.Time.Unix(), CpuCount: int32(m.CPUCount), CpuUsedPct: float32(m.CPUUsedPct),
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
		})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) GetSandboxLogs(w http.ResponseWriter, r *http.Request, id gen.SandboxID, params gen.GetSandboxLogsParams) {
	var start time.Time
	if params.Start != nil {
		start = time.UnixMilli(*params.Start)
	}
	limit := 1000
	if params.Limit != nil {
		if *params.Limit < 0 {
			writeError(w, http.StatusBadRequest, "limit must not be negative")
			return
		}
		limit = int(*params.Limit)
	}
	entries, err := s.cfg.Sandboxes.Logs(r.Context(), teamOf(r), id, start, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := gen.SandboxLogs{Logs: make([]gen.SandboxLog, 0, len(entries)), LogEntries: make([]gen.SandboxLogEntry, 0, len(entries))}
	for _, e := range entries {
		out.Logs = append(out.Logs, gen.SandboxLog{Line: e.Line, Timestamp: e.Time.UTC()})
		out.LogEntries = append(out.LogEntries, gen.SandboxLogEntry{Fields: gen.StringMap(e.Fields), Level: e.Level, Message: e.Message, Timestamp: e.Time.UTC()})
	}
	writeJSON(w, http.StatusOK, out)
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
