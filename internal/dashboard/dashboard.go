// Package dashboard serves Warren's web dashboard on the API's address:
// its page and assets (embedded: no CDN, no Node at run time) under
// /dashboard/, and the two doors through which the page reaches the
// platform.
//
// Sign-in. The page posts an API key or access token to
// /dashboard/session; the credential is checked by the API itself (an
// in-process GET /sandboxes, so that its failure budget and its errors
// apply) and kept in the store, sealed, under the hash of a random
// session ID (sessions.go: every api process of a cluster serves it),
// which the browser holds as a cookie: httpOnly (the page's script never
// sees it), SameSite=Strict, Secure when the request came over TLS or
// the operator's public URL is https, scoped to /dashboard/. Sessions
// expire (SessionTTL) and are bounded in number (MaxSessions,
// MaxSessionsPerTeam). Signing out forgets the session.
//
// The API. The cookie is honoured only under /dashboard/api/: such a
// request has its credential headers and cookies removed, the session's
// credential put in their place, the prefix stripped, and goes to the
// API's handler, which authenticates, scopes by team and answers it as
// any other call. The plain API never looks at cookies, so it keeps
// requiring X-API-Key (or a bearer token), and a revoked key stops its
// sessions at their next request.
//
// envd. /dashboard/envd/{sandboxID}/... reaches the sandbox's envd
// (Connect RPC and /files) through the sandbox proxy: the sandbox is
// looked up through the API with the session's credential (so another
// team's, or an unknown, sandbox is 404), and the proxy gets the
// sandbox's envd access token from the server side, never from the
// page. envd runs inside the sandbox, where its tenant's code may have
// replaced it, so its answers are treated as hostile: Set-Cookie is
// dropped, and every answer is served with nosniff, a sandboxing CSP and
// as an attachment, so that nothing a sandbox sends can run as the
// dashboard.
//
// Volumes. /dashboard/api/volumecontent/{volumeID}/... reaches the
// volume content API with the volume's own token, which the server looks
// up with the session's credential (another team's volume is 404); what
// it answers is served as hostile, as envd's answers are.
//
// Admin. Made with Config.Admin (only on the admin's own listener),
// the handler also serves /dashboard/admin/ (the nodes) to a session
// signed in with the admin token (admin.go).
//
// CSRF. Besides SameSite=Strict, every request under /dashboard/api/,
// /dashboard/envd/ and to /dashboard/session must carry the header
// X-Warren-Dashboard (a cross-origin page cannot send it without a CORS
// preflight, which is never granted), and a request with an Origin must
// come from this server's own origin (the request's, or the operator's
// public URL: publicurl.go).
package dashboard

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/store"
)

//go:embed web
var webFS embed.FS

// Prefix is where the dashboard is served.
const Prefix = "/dashboard/"

// Header is the header every call of the page carries (CSRF).
const Header = "X-Warren-Dashboard"

// SessionHeader says "none" on an answer refused for want of a session
// (rather than by the API), so that the page shows its sign-in again.
const SessionHeader = "X-Warren-Session"

// CookieName is the session cookie's name; AdminCookieName its name on
// the admin's listener, whose sessions are its own (cookies ignore the
// port: the two would otherwise replace each other in a browser).
const (
	CookieName      = "warren_session"
	AdminCookieName = "warren_admin_session"
)

func (h *Handler) cookieName() string {
	if h.cfg.Admin != nil {
		return AdminCookieName
	}
	return CookieName
}

const (
	// SessionTTL is how long a session lasts from sign-in.
	SessionTTL = 12 * time.Hour
	// MaxSessions bounds the sessions kept, all api processes together:
	// each sign-in first drops the expired ones; past it, it is refused
	// (503).
	MaxSessions = 10000
	// MaxSessionsPerTeam bounds one team's sessions: its next sign-in
	// ends its oldest, so that no team can fill the table for the others.
	MaxSessionsPerTeam = 100
	// envdTokenTTL is how long a sandbox's envd token is kept per
	// session, so that a terminal's keystrokes do not each look it up.
	envdTokenTTL = 30 * time.Second
	// envdDeadline bounds an envd exchange (a terminal's stream) in
	// place of the API server's write timeout.
	envdDeadline  = time.Hour
	maxSignInBody = 4096
)

// Config wires a Handler.
type Config struct {
	// API is the platform API's handler (internal/api), which serves
	// everything outside /dashboard/.
	API http.Handler
	// Envd is the sandbox proxy's handler; nil: /dashboard/envd/ is 501.
	Envd http.Handler
	// EnvdPort is envd's port in sandboxes.
	EnvdPort int
	// Store resolves a signed-in credential's team, which bounds its
	// sessions (MaxSessionsPerTeam); nil: each credential counts as a team.
	Store store.Store
	// Now is the sessions' clock; nil: time.Now.
	Now func() time.Time
	// Admin, if set, opens the admin door (admin.go): only on the
	// admin's own listener (--admin-addr).
	Admin *AdminConfig
	// Sessions keeps the signed-in sessions (the store, which every api
	// process of a cluster shares); required.
	Sessions store.DashboardSessionStore
	// Sealer seals each session's credential at rest with a key every api
	// process has (the cluster secret's, or the node key); required.
	Sealer Sealer
	// PublicURL is the dashboard's origin as browsers see it, when a
	// proxy in front (one terminating TLS, rewriting Host) hides it from
	// the request (warren serve --public-url): calls from it pass the
	// origin check, and an https one makes the cookie Secure. nil: the
	// request's own origin only.
	PublicURL *url.URL
}

// Sealer seals a value bound to a context (internal/secret.Sealer).
type Sealer interface {
	Seal(value, context string) (string, error)
	Open(sealed, context string) (string, error)
}

// Handler serves the dashboard, and the API for everything else.
type Handler struct {
	cfg    Config
	web    fs.FS
	assets http.Handler

	// gz holds each text asset gzipped, made on its first request (the
	// assets are fixed at build time).
	gzMu sync.Mutex
	gz   map[string][]byte

	// tokens caches sandboxes' envd access tokens by session and
	// sandbox (bounded: maxCachedTokens).
	tokensMu sync.Mutex
	tokens   map[string]envdToken
}

// New returns the handler for the API's address.
func New(cfg Config) *Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.EnvdPort == 0 {
		cfg.EnvdPort = 49983
	}
	if cfg.Sessions == nil || cfg.Sealer == nil {
		panic("dashboard: Config.Sessions and Config.Sealer are required")
	}
	sub, err := fs.Sub(webFS, "web")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return &Handler{cfg: cfg, web: sub, assets: http.FileServerFS(sub), gz: map[string][]byte{}, tokens: map[string]envdToken{}}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/" && r.Method == http.MethodGet && wantsHTML(r):
		http.Redirect(w, r, Prefix, http.StatusFound)
	case p == "/dashboard":
		http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
	case strings.HasPrefix(p, Prefix+"api/"):
		h.serveAPI(w, r, strings.TrimPrefix(p, Prefix+"api"))
	case strings.HasPrefix(p, Prefix+"envd/"):
		h.serveEnvd(w, r, strings.TrimPrefix(p, Prefix+"envd/"))
	case strings.HasPrefix(p, Prefix+"admin/"):
		h.serveAdmin(w, r, strings.TrimPrefix(p, Prefix+"admin"))
	case p == Prefix+"session":
		h.serveSession(w, r)
	case strings.HasPrefix(p, Prefix):
		h.serveAsset(w, r, strings.TrimPrefix(p, Prefix))
	default:
		h.cfg.API.ServeHTTP(w, r)
	}
}

// wantsHTML tells a browser's navigation from an SDK's call: the SDK
// sends credentials and no text/html Accept.
func wantsHTML(r *http.Request) bool {
	return r.Header.Get("X-API-Key") == "" && r.Header.Get("Authorization") == "" &&
		strings.Contains(r.Header.Get("Accept"), "text/html")
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// pageHeaders are every dashboard page's and asset's security headers.
func pageHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
}

func (h *Handler) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, "the dashboard's pages are read with GET")
		return
	}
	pageHeaders(w)
	if name == "" {
		name = "index.html"
	}
	if strings.HasPrefix(name, "vendor/") {
		w.Header().Set("Cache-Control", "public, max-age=86400")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	if h.serveGzipped(w, r, name) {
		return
	}
	if name == "index.html" {
		name = "" // the file server redirects index.html to its directory
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/" + name
	h.assets.ServeHTTP(w, r2)
}

// textTypes are the assets served gzipped, and their types.
var textTypes = map[string]string{
	".js": "text/javascript; charset=utf-8", ".mjs": "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8", ".html": "text/html; charset=utf-8",
}

// serveGzipped serves a text asset gzipped to a browser that takes it
// (a third of the bytes); false: not such an asset or request.
func (h *Handler) serveGzipped(w http.ResponseWriter, r *http.Request, name string) bool {
	ctype, text := textTypes[path.Ext(name)]
	if !text || !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") || !fs.ValidPath(name) {
		return false
	}
	h.gzMu.Lock()
	body, ok := h.gz[name]
	h.gzMu.Unlock()
	if !ok {
		raw, err := fs.ReadFile(h.web, name)
		if err != nil {
			return false
		}
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		_, _ = zw.Write(raw)
		_ = zw.Close()
		body = buf.Bytes()
		h.gzMu.Lock()
		h.gz[name] = body
		h.gzMu.Unlock()
	}
	hd := w.Header()
	hd.Set("Content-Type", ctype)
	hd.Set("Content-Encoding", "gzip")
	hd.Set("Vary", "Accept-Encoding")
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	return true
}

// checkCSRF refuses a call that a page of another origin could have
// made: one without the dashboard's header, or with a foreign Origin.
func (h *Handler) checkCSRF(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get(Header) == "" {
		writeError(w, http.StatusForbidden, "dashboard calls carry the "+Header+" header")
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && !h.sameOrigin(o, r) {
		writeError(w, http.StatusForbidden, "cross-origin dashboard calls are refused")
		return false
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		writeError(w, http.StatusForbidden, "cross-site dashboard calls are refused")
		return false
	}
	return true
}

// sameOrigin tells whether origin is the dashboard's: the request's own
// (its scheme and Host), or the operator's PublicURL. Forwarded headers
// (X-Forwarded-*, Forwarded) are never read: anyone can send them.
func (h *Handler) sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Path != "" || u.RawQuery != "" || u.User != nil {
		return false
	}
	if p := h.cfg.PublicURL; p != nil && u.Scheme == p.Scheme && strings.EqualFold(u.Host, p.Host) {
		return true
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return u.Scheme == scheme && strings.EqualFold(u.Host, r.Host)
}

// cookie is the session cookie: Secure when the request came over TLS or
// the PublicURL is https (a TLS terminator in front).
func (h *Handler) cookie(r *http.Request, value string, maxAge int) *http.Cookie {
	secure := r.TLS != nil || (h.cfg.PublicURL != nil && h.cfg.PublicURL.Scheme == "https")
	return &http.Cookie{Name: h.cookieName(), Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure}
}

// serveSession: GET tells whether the cookie's session is live, POST
// signs in ({"key": "e2b_…" or "sk_e2b_…"}), DELETE signs out.
func (h *Handler) serveSession(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if !h.checkCSRF(w, r) {
		return
	}
	switch r.Method {
	case http.MethodGet:
		s, err := h.sessionOf(r)
		if err != nil {
			storeError(w, err)
			return
		}
		if s == nil {
			writeError(w, http.StatusUnauthorized, "not signed in")
			return
		}
		writeJSONBody(w, http.StatusOK, map[string]any{"key": s.mask, "expires": s.expires.UTC(), "admin": s.admin})
	case http.MethodDelete:
		if err := h.endSession(r.Context(), r); err != nil {
			storeError(w, err)
			return
		}
		http.SetCookie(w, h.cookie(r, "", -1))
		w.WriteHeader(http.StatusNoContent)
	case http.MethodPost:
		h.signIn(w, r)
	default:
		writeError(w, http.StatusMethodNotAllowed, "GET, POST or DELETE")
	}
}

func (h *Handler) signIn(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Key string `json:"key"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxSignInBody)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "the body is {\"key\": \"<API key or access token>\"}")
		return
	}
	secret := strings.TrimSpace(body.Key)
	header, value := "X-API-Key", secret
	if strings.HasPrefix(secret, "sk_e2b_") {
		header, value = "Authorization", "Bearer "+secret
	}
	if secret == "" {
		writeError(w, http.StatusUnauthorized, "missing credentials: paste an API key (e2b_…) or an access token (sk_e2b_…)")
		return
	}
	if h.isAdminToken(secret) {
		h.startSession(w, r, &session{team: adminTeam, admin: true, secret: secret, mask: mask(secret)})
		return
	}
	// The API judges the credential: its failure budget and its
	// messages are the sign-in's.
	check := httptest.NewRecorder()
	req := h.apiRequest(r.Context(), r, http.MethodGet, "/sandboxes", nil)
	req.Header.Set(header, value)
	h.cfg.API.ServeHTTP(check, req)
	if check.Code != http.StatusOK {
		copyHeader(w.Header(), check.Header(), "Retry-After", "Content-Type")
		w.WriteHeader(check.Code)
		_, _ = w.Write(check.Body.Bytes())
		return
	}
	team, err := h.teamOf(r.Context(), secret)
	if err != nil || team == "" {
		writeError(w, http.StatusUnauthorized, "invalid API key or access token")
		return
	}
	h.startSession(w, r, &session{header: header, secret: value, team: team, mask: mask(secret)})
}

// teamOf is the team a credential the API accepted belongs to.
func (h *Handler) teamOf(ctx context.Context, secret string) (string, error) {
	if h.cfg.Store == nil {
		return "credential:" + auth.Hash(secret), nil
	}
	kind := store.KindAPIKey
	if strings.HasPrefix(secret, auth.AccessTokenPrefix) {
		kind = store.KindAccessToken
	}
	k, err := auth.Authenticate(ctx, h.cfg.Store, kind, secret)
	if err != nil {
		return "", err
	}
	return k.TeamID, nil
}

func mask(secret string) string {
	if len(secret) <= 12 {
		return strings.Repeat("*", len(secret))
	}
	return secret[:8] + "…" + secret[len(secret)-4:]
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func copyHeader(dst, src http.Header, names ...string) {
	for _, n := range names {
		if v := src.Values(n); len(v) > 0 {
			dst[http.CanonicalHeaderKey(n)] = v
		}
	}
}

// apiRequest is an in-process request to the API on behalf of r: r's
// client address, none of its credentials or cookies.
func (h *Handler) apiRequest(ctx context.Context, r *http.Request, method, path string, body io.Reader) *http.Request {
	req := httptest.NewRequestWithContext(ctx, method, path, body)
	req.RemoteAddr = r.RemoteAddr
	req.Host = r.Host
	return req
}

// stripCredentials removes whatever credential or cookie the browser
// sent, so that only the session's reaches the API or a sandbox.
func stripCredentials(hd http.Header) {
	for _, n := range []string{"Cookie", "X-API-Key", "Authorization", "X-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port", Header} {
		hd.Del(n)
	}
}

// authorize checks CSRF and the session.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request) *session {
	w.Header().Set("Cache-Control", "no-store")
	if !h.checkCSRF(w, r) {
		return nil
	}
	s, err := h.sessionOf(r)
	if err != nil {
		storeError(w, err)
		return nil
	}
	if s == nil {
		w.Header().Set(SessionHeader, "none")
		writeError(w, http.StatusUnauthorized, "not signed in (or the session expired): sign in again")
		return nil
	}
	return s
}

// authorizeTeam is authorize for a team's doors (the API, envd): the
// admin token is no team's credential and never reaches them.
func (h *Handler) authorizeTeam(w http.ResponseWriter, r *http.Request) *session {
	s := h.authorize(w, r)
	if s != nil && s.admin {
		writeError(w, http.StatusForbidden, "signed in as the admin: sign in with a team's API key or access token for its sandboxes")
		return nil
	}
	return s
}

func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request, path string) {
	s := h.authorizeTeam(w, r)
	if s == nil {
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = path
	r2.URL.RawPath = ""
	r2.RequestURI = ""
	stripCredentials(r2.Header)
	if rest, ok := strings.CutPrefix(path, volumeContentPrefix); ok {
		// The volume content API takes the volume's own token, which the
		// server finds with the session's credential (so another team's
		// volume is the API's 404) and the page never sees.
		id, _, _ := strings.Cut(rest, "/")
		tok, ok := h.volumeToken(w, r, s, id)
		if !ok {
			return
		}
		r2.Header.Set("Authorization", "Bearer "+tok)
		// A volume's files are written by its sandboxes' code: served as
		// hostile, as envd's answers are.
		h.cfg.API.ServeHTTP(&hostileWriter{ResponseWriter: w}, r2)
		return
	}
	r2.Header.Set(s.header, s.secret)
	h.cfg.API.ServeHTTP(w, r2)
}

// volumeContentPrefix is the API's volume content routes' prefix.
const volumeContentPrefix = "/volumecontent/"

// volumeToken finds a volume's content token through the API with the
// session's credential: the API's answer is the caller's when it fails.
func (h *Handler) volumeToken(w http.ResponseWriter, r *http.Request, s *session, id string) (string, bool) {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/?#%") {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid volume ID %q", id))
		return "", false
	}
	rec, ok := h.apiGet(w, r, s, "/volumes/"+url.PathEscape(id))
	if !ok {
		return "", false
	}
	var v struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || v.Token == "" {
		writeError(w, http.StatusBadGateway, "the volume's record could not be read")
		return "", false
	}
	return v.Token, true
}

// apiGet asks the API for path with the session's credential; when the
// API does not answer 200, its answer is written as the caller's and ok
// is false.
func (h *Handler) apiGet(w http.ResponseWriter, r *http.Request, s *session, path string) (rec *httptest.ResponseRecorder, ok bool) {
	rec = httptest.NewRecorder()
	req := h.apiRequest(r.Context(), r, http.MethodGet, path, nil)
	req.Header.Set(s.header, s.secret)
	h.cfg.API.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		copyHeader(w.Header(), rec.Header(), "Retry-After", "Content-Type")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		return nil, false
	}
	return rec, true
}

// envdToken finds the sandbox's envd access token through the API with
// the session's credential: the API's answer (404 for another team's
// sandbox) is the caller's when it fails.
func (h *Handler) envdToken(w http.ResponseWriter, r *http.Request, s *session, id string) (string, bool) {
	now := h.cfg.Now()
	if tok, ok := h.cachedToken(s, id, now); ok {
		return tok, true
	}
	rec, ok := h.apiGet(w, r, s, "/sandboxes/"+url.PathEscape(id))
	if !ok {
		return "", false
	}
	var sb struct {
		EnvdAccessToken *string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &sb); err != nil {
		writeError(w, http.StatusBadGateway, "the sandbox's record could not be read")
		return "", false
	}
	tok := ""
	if sb.EnvdAccessToken != nil {
		tok = *sb.EnvdAccessToken
	}
	h.cacheToken(s, id, tok, now)
	return tok, true
}

// validSandboxID is what the proxy accepts as a sandbox ID.
func validSandboxID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, rest string) {
	s := h.authorizeTeam(w, r)
	if s == nil {
		return
	}
	if h.cfg.Envd == nil {
		writeError(w, http.StatusNotImplemented, "this server has no sandbox proxy")
		return
	}
	id, path, _ := strings.Cut(rest, "/")
	if !validSandboxID(id) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid sandbox ID %q", id))
		return
	}
	tok, ok := h.envdToken(w, r, s, id)
	if !ok {
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/" + path
	r2.URL.RawPath = ""
	r2.RequestURI = ""
	// envd's Basic Authorization names the user a call runs as (no
	// secret): the only Authorization passed to a sandbox.
	user := r.Header.Get("Authorization")
	stripCredentials(r2.Header)
	if len(user) > 6 && strings.EqualFold(user[:6], "basic ") {
		r2.Header.Set("Authorization", user)
	}
	r2.Header.Del("Origin")
	r2.Header.Set("E2b-Sandbox-Id", id)
	r2.Header.Set("E2b-Sandbox-Port", fmt.Sprint(h.cfg.EnvdPort))
	if tok != "" {
		r2.Header.Set("X-Access-Token", tok)
	}
	// A terminal's stream outlives the API server's write timeout.
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(envdDeadline))
	_ = rc.SetReadDeadline(time.Now().Add(envdDeadline))
	h.cfg.Envd.ServeHTTP(&hostileWriter{ResponseWriter: w}, r2)
}

// hostileWriter serves what a sandbox answers so that it cannot act as
// the dashboard's origin.
type hostileWriter struct {
	http.ResponseWriter
	wrote bool
}

func (hw *hostileWriter) WriteHeader(status int) {
	if !hw.wrote {
		hw.wrote = true
		hd := hw.ResponseWriter.Header()
		hd.Del("Set-Cookie")
		hd.Del("Access-Control-Allow-Origin")
		hd.Del("Access-Control-Allow-Credentials")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Content-Security-Policy", "sandbox; default-src 'none'")
		hd.Set("Content-Disposition", "attachment")
		hd.Set("Cache-Control", "no-store")
	}
	hw.ResponseWriter.WriteHeader(status)
}

func (hw *hostileWriter) Write(b []byte) (int, error) {
	if !hw.wrote {
		hw.WriteHeader(http.StatusOK)
	}
	return hw.ResponseWriter.Write(b)
}

func (hw *hostileWriter) Unwrap() http.ResponseWriter { return hw.ResponseWriter }

func (hw *hostileWriter) Flush() {
	if !hw.wrote {
		hw.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(hw.ResponseWriter).Flush()
}

// hashID is what the store keeps of a session's ID.
func hashID(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}
