// Package api serves Warren's platform API, the E2B-compatible REST API
// described by api/openapi.yml, whose server interface and types are
// generated into internal/api/gen.
//
// This package does HTTP only: authentication (X-API-Key, or an access
// token as Authorization: Bearer), decoding and validating requests,
// E2B's error bodies ({"code": status, "message"}; many SDK call sites read
// the code from the body, not the status), pagination and encoding. What
// happens to sandboxes is internal/sandbox's.
//
// Hostile clients. Every request gets a fresh ID (X-Request-Id); a 500
// never carries the error, which is logged under that ID. JSON bodies are
// capped at 1 MiB (413). Each team has a token bucket (Config.RateLimit,
// 429 with Retry-After), and each client address a budget of failed
// authentications that, once spent, refuses its requests before their
// credentials are looked at. While the data dir's free space is below
// Config.DiskReserveMB, what would fill it (sandbox creates, template
// builds, uploads) is refused with 507 before anything is made.
// NewHTTPServer sets the connection limits: header, read, write and idle
// timeouts, with a longer deadline for the upload only.
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
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/identity"
	"github.com/warren-sandbox/warren/internal/ratelimit"
	"github.com/warren-sandbox/warren/internal/reqid"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/template"
)

// Timeouts a create request gets when it names none: the seed's 15 s on
// POST /sandboxes, and 300 s on POST /v2/sandboxes, which is what E2B's
// API does and what SDK 2.51 (which omits the field) relies on.
const (
	DefaultTimeoutV1 = 15 * time.Second
	DefaultTimeoutV2 = 300 * time.Second
	// MaxTimeout bounds every timeout a client asks for (the sandbox
	// manager's bound, which it applies again).
	MaxTimeout = sandbox.MaxTimeout
	// defaultRefresh and maxRefresh bound POST .../refreshes.
	defaultRefresh = 60 * time.Second
	maxRefresh     = sandbox.MaxRefresh
	maxBody        = 1 << 20
)

// Config wires a Server.
type Config struct {
	// MaxTimeout bounds every timeout a client asks for (`warren serve
	// --max-sandbox-timeout`); default MaxTimeout.
	MaxTimeout time.Duration
	Store      store.Store
	Sandboxes  Sandboxes
	// Templates builds and keeps templates; nil: their routes answer 501.
	Templates Templates
	// Secrets keeps the teams' secrets; nil: the secret endpoints answer 501.
	Secrets Secrets
	// Volumes keeps team volumes and serves their content API; nil: no
	// volumes (their endpoints answer 404).
	Volumes Volumes
	// Webhooks keeps the teams' webhooks; nil: their endpoints answer
	// 501 (the events polling API is the store's, always served).
	Webhooks Webhooks
	// ClientID is what the deprecated clientID field says (the node name).
	ClientID string
	// NodeCPUs and NodeMemoryMB are the node's totals: a template asking
	// more than the whole node has is refused (400). 0: no such bound.
	NodeCPUs, NodeMemoryMB int
	// DiskReserveMB is the free space the data dir's file system keeps:
	// below it (as FreeDiskMB reads it), template builds and template
	// file uploads are refused with 507 before anything is made.
	// Sandbox creates and forks are judged by the node that makes them
	// (sandbox.ErrDiskFull), not here. 0 or a nil FreeDiskMB: no reserve.
	DiskReserveMB int64
	FreeDiskMB    func() (int64, error)
	// VolumeFreeDiskMB is the free space of the volume root's file
	// system, which volume creates and content writes fill (with
	// DiskReserveMB); nil: FreeDiskMB.
	VolumeFreeDiskMB func() (int64, error)
	// TeamDiskQuotaMB bounds what a team's volumes, paused sandboxes,
	// templates and snapshots take of the nodes' disks (as the store
	// accounts it, store.DiskUsageStore): an operation that would add to
	// a team at or over it is refused with 507. 0: no quota.
	TeamDiskQuotaMB int64
	// VolumeQuotaMB is the size of a new volume (--volume-quota), what a
	// volume create adds to its team's disk usage.
	VolumeQuotaMB int64
	// RateLimit is the requests per second a team may make (burst twice
	// that); over it: 429 with Retry-After. 0: no limit.
	RateLimit float64
	// UploadTimeout bounds a template file upload (the signed PUT), which
	// the server's read and write timeouts would cut. Default 30 min.
	UploadTimeout time.Duration
	// ContentTimeout bounds a volume file's read or write through the
	// content API (the SDK waits an hour). Default 1 h.
	ContentTimeout time.Duration
	// JWKS returns the public keys of workload identity tokens (every
	// node's), served without credentials at identity.JWKSPath; nil: that
	// path is 404.
	JWKS func(ctx context.Context) (identity.JWKS, error)
	// IdentityIssuer, when not empty, is the tokens' iss: the API then
	// also serves /.well-known/openid-configuration naming the JWKS, for
	// verifiers that discover keys by issuer (OIDC federation).
	IdentityIssuer string
	// Now is the rate limiters' clock; nil: time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Server implements gen.ServerInterface.
type Server struct {
	cfg Config
	log *slog.Logger
	// teams limits each team's requests; nil when Config.RateLimit is 0.
	teams *ratelimit.Keyed
	// authFailures is each client address's budget of requests that fail
	// authentication: spent by each failure; once spent, further failures
	// are answered 429 instead of 401. Valid credentials never are.
	authFailures *ratelimit.Keyed
	// jwks caches the identity keys (their path is open to anyone).
	jwks jwksCache
}

var _ gen.ServerInterface = (*Server)(nil)

// Failed authentications a client address may make: a burst of
// authFailureBurst, then one per second. Past it, each further failure
// from that address is answered 429 with Retry-After, which the SDK
// honours by waiting. A request whose credentials are valid is served
// whatever its address spent: behind a load balancer (without
// --trusted-proxy) every tenant shares one address, and one tenant's
// failures must not lock out the others. Credentials are 160-bit random
// secrets, so the budget is not what keeps them from being guessed; it
// slows clients that keep failing.
const (
	authFailureRate  = 1
	authFailureBurst = 20
)

// New returns the API's HTTP handler.
func New(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "warren"
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = MaxTimeout
	}
	if cfg.UploadTimeout <= 0 {
		cfg.UploadTimeout = DefaultUploadTimeout
	}
	if cfg.ContentTimeout <= 0 {
		cfg.ContentTimeout = DefaultContentTimeout
	}
	s := &Server{cfg: cfg, log: reqid.Logger(cfg.Logger),
		authFailures: &ratelimit.Keyed{Rate: authFailureRate, Burst: authFailureBurst, Now: cfg.Now}}
	if cfg.RateLimit > 0 {
		s.teams = &ratelimit.Keyed{Rate: rate.Limit(cfg.RateLimit), Burst: max(1, int(2*cfg.RateLimit)), Now: cfg.Now}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.EscapedPath()))
	})
	s.routeIdentity(mux)
	s.routeEvents(mux)
	h := gen.HandlerWithOptions(s, gen.StdHTTPServerOptions{
		BaseRouter: mux,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadRequest, err.Error())
		},
	})
	return s.withRequestID(s.recoverPanics(s.authenticate(s.limitBody(s.routeAlias(s.routeDashboardAPI(h))))))
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

// teamKey carries the authenticated team (a team.ID) of the request.
type teamKey struct{}

// withTeam is ctx of a request authenticated as team id (a stored
// credential's or volume's): an ID team.Parse refuses is an error, so
// that no request goes on without a team.
func withTeam(ctx context.Context, id string) (context.Context, error) {
	t, err := team.Parse(id)
	if err != nil {
		return nil, fmt.Errorf("the credential's team: %w", err)
	}
	return context.WithValue(ctx, teamKey{}, t), nil
}

// teamIDOf is the request's authenticated team: the zero team.ID, which
// matches nothing, on a request that was not authenticated.
func teamIDOf(r *http.Request) team.ID { t, _ := r.Context().Value(teamKey{}).(team.ID); return t }

// teamOf is teamIDOf as a string, as the store and the template builder
// take it: "" (which they match nothing with) when not authenticated.
func teamOf(r *http.Request) string { return teamIDOf(r).String() }

// kindKey carries the kind of credential the request came with.
type kindKey struct{}

func credentialOf(r *http.Request) store.KeyKind {
	k, _ := r.Context().Value(kindKey{}).(store.KeyKind)
	return k
}

// isUpload tells the template file upload, whose URL is signed: it needs
// no credentials and its body is an archive, not JSON.
func isUpload(r *http.Request) bool {
	return r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, template.UploadPathPrefix)
}

// authenticate resolves the caller's team from X-API-Key, or from an
// access token in Authorization: Bearer, and applies the team's rate
// limit. Only /health (the platform API's and the dashboard API's), the
// identity keys (public by nature) and template
// file uploads (whose URLs are signed) are open. A failure spends the client address's budget (authFailed).
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || r.URL.Path == DashboardAPIPrefix+"/health" || isIdentityDiscovery(r) {
			next.ServeHTTP(w, r)
			return
		}
		client := ratelimit.ClientKey(r.RemoteAddr)
		if isUpload(r) {
			// The signature is checked by the builder; a bad one spends
			// the address's budget like a bad key.
			next.ServeHTTP(&authWatcher{ResponseWriter: w, spent: func() (bool, time.Duration) { return s.spendFailure(client) }}, r)
			return
		}
		if id, ok := volumeContentID(r); ok {
			s.authenticateVolume(next, w, r, id, client)
			return
		}
		kind, secret := store.KindAPIKey, r.Header.Get("X-API-Key")
		if secret == "" {
			if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
				kind, secret = store.KindAccessToken, strings.TrimSpace(h[7:])
			}
		}
		if secret == "" {
			s.authFailed(w, client, "missing credentials: send an API key in the X-API-Key header (or an access token as Authorization: Bearer)")
			return
		}
		key, err := auth.Authenticate(r.Context(), s.cfg.Store, kind, secret)
		if errors.Is(err, auth.ErrUnauthorized) {
			s.authFailed(w, client, "invalid API key or access token")
			return
		}
		if err != nil {
			s.internal(w, r, err)
			return
		}
		if s.teams != nil {
			if ok, wait := s.teams.Allow(key.TeamID); !ok {
				tooMany(w, wait, fmt.Sprintf("the team's rate limit (%g requests/s) is exceeded; retry later", s.cfg.RateLimit))
				return
			}
		}
		ctx, err := withTeam(r.Context(), key.TeamID)
		if err != nil {
			s.internal(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, kindKey{}, key.Kind)))
	})
}

// spendFailure counts a failed authentication against client's budget:
// it reports whether the budget was already spent, and how long until it
// is not.
func (s *Server) spendFailure(client string) (spent bool, wait time.Duration) {
	if blocked, wait := s.authFailures.Blocked(client); blocked {
		return true, wait
	}
	s.authFailures.Spend(client)
	return false, 0
}

// authFailed answers a request whose credentials failed: 401 with msg,
// or 429 with Retry-After once client's budget of failures is spent.
func (s *Server) authFailed(w http.ResponseWriter, client, msg string) {
	if spent, wait := s.spendFailure(client); spent {
		tooMany(w, wait, tooManyFailures)
		return
	}
	writeError(w, http.StatusUnauthorized, msg)
}

const tooManyFailures = "too many failed authentications from this address; retry later"

// authWatcher spends the budget when the response is a 403 (a bad
// signature), and turns it into a 429 once the budget is spent.
type authWatcher struct {
	http.ResponseWriter
	spent   func() (bool, time.Duration)
	refused bool // the handler's 403 became a 429: drop its body
}

func (a *authWatcher) WriteHeader(status int) {
	if status == http.StatusForbidden {
		if spent, wait := a.spent(); spent {
			a.refused = true
			a.ResponseWriter.Header().Del("Content-Length")
			tooMany(a.ResponseWriter, wait, tooManyFailures)
			return
		}
	}
	a.ResponseWriter.WriteHeader(status)
}

func (a *authWatcher) Write(b []byte) (int, error) {
	if a.refused {
		return len(b), nil
	}
	return a.ResponseWriter.Write(b)
}

func (a *authWatcher) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// tooMany answers 429 with Retry-After in whole seconds, which the SDK
// honours by retrying.
func tooMany(w http.ResponseWriter, wait time.Duration, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(ratelimit.RetryAfter(wait)))
	writeError(w, http.StatusTooManyRequests, msg)
}

// limitBody caps request bodies at maxBody (413), except the upload's
// and a volume file's.
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isUpload(r) && !isVolumeFileWrite(r) {
			if r.ContentLength > maxBody {
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", maxBody))
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		}
		next.ServeHTTP(w, r)
	})
}

// requestID is the ID withRequestID gave the request.
func requestID(r *http.Request) string {
	return reqid.FromContext(r.Context())
}

// RequestIDHeader carries each response's request ID, which the server
// log's lines about that request name too.
const RequestIDHeader = reqid.Header

// withRequestID names each request with a fresh ID (never the client's),
// returned in RequestIDHeader and carried by its context, whose log lines
// (logged with that context) name it.
func (s *Server) withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := reqid.New()
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(reqid.NewContext(r.Context(), id)))
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
				s.log.ErrorContext(r.Context(), "API request failed", "method", r.Method, "path", r.URL.Path, "err", fmt.Errorf("panic: %v\n%s", v, debug.Stack()))
				writeErrorCode(w, http.StatusInternalServerError, CodeInternal, reqid.InternalMessage(requestID(r)))
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

// internal answers 500 without a word of the error, which goes to the
// log under the request's ID; the body names only that ID.
func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	id := requestID(r)
	if store.Unavailable(err) {
		// PostgreSQL down or restarting: a moment's outage, not a bug;
		// the client retries (docs/chaos.md measures the window).
		s.log.WarnContext(r.Context(), "API request failed: the store is unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "the store is unavailable for a moment, please retry (request "+id+")")
		return
	}
	s.log.ErrorContext(r.Context(), "API request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, reqid.InternalMessage(id))
}

// fail maps the sandbox manager's errors to statuses.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var re *sandbox.ResumeError
	switch {
	case errors.As(err, &re):
		s.resumeFailed(w, r, re)
	case errors.Is(err, sandbox.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, sandbox.ErrTemplateNotFound), errors.Is(err, sandbox.ErrVolumeNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, sandbox.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, sandbox.ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, sandbox.ErrTeamLimit):
		writeError(w, http.StatusTooManyRequests, err.Error())
	case errors.Is(err, sandbox.ErrDiskFull):
		writeError(w, http.StatusInsufficientStorage, err.Error())
	case errors.Is(err, sandbox.ErrNoCapacity), errors.Is(err, sandbox.ErrNodeUnavailable):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client is gone; nobody reads the answer.
		writeError(w, 499, "client closed request")
	default:
		s.internal(w, r, err)
	}
}

// readJSON reads a JSON body into v, or answers the error (400, or 413
// for a body over maxBody) and returns false. Unknown fields are allowed
// (the SDK sends some); an empty body leaves v as it is when optional.
func readJSON(w http.ResponseWriter, r *http.Request, v any, optional bool) bool {
	status, err := decode(r.Body, v, optional)
	if err != nil {
		writeError(w, status, err.Error())
		return false
	}
	return true
}

func decode(body io.Reader, v any, optional bool) (status int, _ error) {
	data, err := io.ReadAll(io.LimitReader(body, maxBody+1))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) || len(data) > maxBody {
		return http.StatusRequestEntityTooLarge, fmt.Errorf("the body is larger than %d bytes", maxBody)
	}
	if err != nil {
		return http.StatusBadRequest, fmt.Errorf("reading the body: %w", err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		if optional {
			return 0, nil
		}
		return http.StatusBadRequest, errors.New("a JSON body is required")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err)
	}
	return 0, nil
}

// seconds turns a request's timeout into a duration, or the default.
func (s *Server) seconds(v *int32, def time.Duration, field string) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	d := time.Duration(*v) * time.Second
	if *v < 0 || d > s.cfg.MaxTimeout {
		return 0, fmt.Errorf("%s must be between 0 and %d seconds", field, int(s.cfg.MaxTimeout.Seconds()))
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
	if !readJSON(w, r, &body, false) {
		return
	}
	if body.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	timeout, err := s.seconds(body.Timeout, defTimeout, "timeout")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	req := sandbox.CreateRequest{
		TeamID: teamIDOf(r), TemplateID: body.TemplateID, Timeout: timeout,
		Metadata: map[string]string(deref(body.Metadata)), EnvVars: map[string]string(deref(body.EnvVars)),
		AutoPause: deref(body.AutoPause), AutoPauseMemory: body.AutoPauseMemory, Secure: true,
		AllowInternetAccess: body.AllowInternetAccess,
	}
	if body.AutoResume != nil {
		req.AutoResume = deref(body.AutoResume.Enabled)
	}
	req.Extra.Network = networkOf(body.Network)
	if body.VolumeMounts != nil {
		for _, v := range *body.VolumeMounts {
			req.VolumeMounts = append(req.VolumeMounts, sandbox.VolumeMount{Name: v.Name, Path: v.Path})
		}
	}
	if body.Mcp != nil {
		req.Extra.MCP = *body.Mcp
	}
	req.Extra.IAM = iamOf(body.Iam)
	// The node that makes the sandbox checks its own disk
	// (sandbox.ErrDiskFull): the api's may be another machine's.
	rec, err := s.cfg.Sandboxes.Create(r.Context(), req)
	if err != nil {
		s.failStart(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxOf(rec))
}

// iamOf is a create's workload identity; no tokens (E2B: an empty map
// too) is none. The node checks it (sandbox.checkIAM).
func iamOf(in *gen.SandboxIam) *sandbox.IAM {
	if in == nil || in.Tokens == nil || len(*in.Tokens) == 0 {
		return nil
	}
	out := &sandbox.IAM{Tokens: map[string]sandbox.IAMToken{}}
	for name, t := range *in.Tokens {
		out.Tokens[name] = sandbox.IAMToken{Audience: t.Audience, TokenType: t.TokenType}
	}
	return out
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
	for _, v := range rec.VolumeMounts {
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
	rec, err := s.cfg.Sandboxes.Get(r.Context(), teamIDOf(r), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	l, _ := s.listedAndExtra(rec)
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
	d.Network = networkConfigOf(rec)
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) ListSandboxes(w http.ResponseWriter, r *http.Request, params gen.ListSandboxesParams) {
	meta, err := parseMetadata(params.Metadata)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	recs, err := s.cfg.Sandboxes.List(r.Context(), teamIDOf(r), store.SandboxFilter{
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
	recs, err := s.cfg.Sandboxes.List(r.Context(), teamIDOf(r), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(f.States) == 0 || slices.Contains(f.States, store.StateRunning) {
		// X-Total-Running: E2B's count of the running sandboxes the
		// filters match, before pagination.
		all := f
		all.States, all.After, all.Limit = []store.SandboxState{store.StateRunning}, nil, 0
		running, err := s.countRunning(r.Context(), teamIDOf(r), all)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
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

// Counter is what a sandbox service may offer beside Sandboxes: the
// number of a team's sandboxes f matches, as List would return them but
// without reading them. X-Total-Running comes with every page of a
// listing: listing a team's 10,000 running sandboxes for it took most of
// a page's time (test/scale).
type Counter interface {
	CountSandboxes(ctx context.Context, teamID team.ID, f store.SandboxFilter) (int, error)
}

// countRunning counts what f matches, through the service's Counter when
// it has one.
func (s *Server) countRunning(ctx context.Context, teamID team.ID, f store.SandboxFilter) (int, error) {
	if c, ok := s.cfg.Sandboxes.(Counter); ok {
		return c.CountSandboxes(ctx, teamID, f)
	}
	recs, err := s.cfg.Sandboxes.List(ctx, teamID, f)
	return len(recs), err
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

// maxMetadataPairs bounds the pairs of a metadata filter.
const maxMetadataPairs = 64

// parseMetadata decodes the metadata filter as the SDK encodes it: a
// query string of pairs whose keys and values are percent-encoded once
// more (wire contract §3.2). Keys are not empty and not repeated.
func parseMetadata(p *string) (map[string]string, error) {
	if p == nil || *p == "" {
		return nil, nil
	}
	q, err := url.QueryUnescape(*p)
	if err != nil {
		return nil, fmt.Errorf("invalid metadata filter: %w", err)
	}
	pairs := strings.Split(q, "&")
	if len(pairs) > maxMetadataPairs {
		return nil, fmt.Errorf("invalid metadata filter: more than %d pairs", maxMetadataPairs)
	}
	out := map[string]string{}
	for _, pair := range pairs {
		kv := strings.Split(pair, "=")
		if len(kv) != 2 {
			return nil, fmt.Errorf("invalid metadata filter %q: want key=value pairs joined by &", *p)
		}
		k, err1 := url.QueryUnescape(kv[0])
		v, err2 := url.QueryUnescape(kv[1])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("invalid metadata filter: %w", err)
		}
		if k == "" {
			return nil, errors.New("invalid metadata filter: an empty key")
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("invalid metadata filter: key %q given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

func (s *Server) KillSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	if err := s.cfg.Sandboxes.Kill(r.Context(), teamIDOf(r), id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) SetSandboxTimeout(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body struct {
		Timeout *int32 `json:"timeout"`
	}
	if !readJSON(w, r, &body, false) {
		return
	}
	if body.Timeout == nil {
		writeError(w, http.StatusBadRequest, "timeout is required")
		return
	}
	d, err := s.seconds(body.Timeout, 0, "timeout")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.cfg.Sandboxes.SetTimeout(r.Context(), teamIDOf(r), id, d); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) RefreshSandbox(w http.ResponseWriter, r *http.Request, id gen.SandboxID) {
	var body gen.RefreshSandboxJSONBody
	if !readJSON(w, r, &body, true) {
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
	if err := s.cfg.Sandboxes.Refresh(r.Context(), teamIDOf(r), id, d); err != nil {
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
	if !readJSON(w, r, &body, true) {
		return
	}
	timeout, err := s.seconds(body.Timeout, defTimeout, "timeout")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// memory false: a paused sandbox boots anew on its files (the SDK's
	// onResume "reboot").
	rec, resumed, err := s.cfg.Sandboxes.Connect(r.Context(), teamIDOf(r), id, timeout, body.Memory == nil || *body.Memory)
	if err != nil {
		s.failStart(w, r, err)
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
	ms, err := s.cfg.Sandboxes.Metrics(r.Context(), teamIDOf(r), id, start, end)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]gen.SandboxMetric, 0, len(ms))
	for _, m := range ms {
		out = append(out, gen.SandboxMetric{
			Timestamp: m.Time.UTC(), TimestampUnix: m.Time.Unix(), CpuCount: int32(m.CPUCount), CpuUsedPct: float32(m.CPUUsedPct),
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
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
	entries, err := s.cfg.Sandboxes.Logs(r.Context(), teamIDOf(r), id, start, limit)
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
