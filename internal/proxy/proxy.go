// Package proxy carries sandbox traffic: the SDK's envd calls (Connect RPC
// and /files on port 49983) and users' traffic to any port inside a
// sandbox. It never goes through the platform API's handlers.
//
// Routing follows E2B's proxy. A request that carries E2b-Sandbox-Id or
// E2b-Sandbox-Port (the SDK always sends both on envd calls, which is what
// makes E2B_SANDBOX_URL work) is routed by those headers; any other by its
// Host, {port}-{sandboxID}.{domain}. Both are parsed strictly (ParseRoute):
// a sandbox ID is lower-case letters and digits, a port 1..65535 in plain
// digits, a host ASCII (compared in lower case, a trailing dot and a
// :port allowed) with nothing between its first label and the domain;
// headers given twice are refused. Errors are JSON with the status as
// code: 400 for a request that names no sandbox, 502 when the sandbox is
// gone (the SDK reads that as "not running") or its port is closed, 409
// while it changes state, 403 for a missing traffic token, 500 (naming
// only a request ID; the detail is logged) for anything else.
//
// Credentials before side effects. A paused sandbox created with
// autoResume resumes on traffic, but only once the request has passed the
// sandbox's traffic token check, and, on envd's port (which the traffic
// token does not guard), only with envd's access token: nobody resumes a
// sandbox with its ID alone. Requests refused for a wrong token spend
// their client address's budget; once it is spent, that address's further
// failures get 429 with Retry-After, while its requests with the right
// token are still served (behind a load balancer, all clients may share
// one address).
//
// CORS. A browser's preflight names no sandbox (it carries none of the
// headers it asks leave for), so one that nothing routes is answered
// with envd's own CORS grant (envdinfo.CORS): E2B's dashboard calls envd
// from the browser through one E2B_SANDBOX_URL.
//
// Signed URLs. The SDK's uploadUrl() and downloadUrl() with E2B_SANDBOX_URL
// set name no sandbox: they are /files URLs on the proxy's own host with a
// signature made from one sandbox's envd access token. A GET or POST to
// /files that no header or host routes is routed by that signature: to
// the sandbox whose token made it (Resolver.SignedBy checks every
// sandbox's token, in constant time each, whatever matches). Nothing tells
// a caller which part of a bad signature failed: path, user, operation
// and token are all "invalid signature" (401, spending the address's
// budget); an expired but genuine one reaches envd, which says so.
//
// Kill and pause end traffic. Every exchange the proxy carries is
// registered with its sandbox (Resolver.Track); when the sandbox is
// killed or paused, each one ends at once: an exchange still waiting for
// its answer gets the 502 of a gone sandbox, one whose answer is under
// way (a command's output stream) or a WebSocket is cut, which the SDK
// reads as a dropped connection and, finding the sandbox gone, reports as
// a TimeoutError.
//
// Responses are flushed as they come (Connect server streams and
// long-polls must not be buffered), and WebSocket upgrades pass through.
// Each sandbox has its own transport, owned by the resolver: sandbox
// addresses are reused, and a kept-alive connection to a gone sandbox must
// never carry a request to the next one at that address, so the owner
// closes the transport's idle connections when the sandbox goes.
package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/filesig"
	"github.com/warren-sandbox/warren/internal/ratelimit"
	"github.com/warren-sandbox/warren/internal/reqid"
)

// Errors a Resolver returns (possibly wrapped).
var (
	ErrNotFound      = errors.New("sandbox not found")
	ErrTransitioning = errors.New("sandbox is changing state")
	// ErrTeamLimit: a paused sandbox cannot resume on traffic now, its
	// team runs the most sandboxes it may (429).
	ErrTeamLimit = errors.New("the sandbox's team is at its sandbox limit")
)

// Target is where a sandbox's traffic goes.
type Target struct {
	// IP is the sandbox's address, reachable from the host.
	IP netip.Addr
	// Transport is the sandbox's own; nil means a shared default.
	Transport http.RoundTripper
	// TrafficToken, if set, must come in header e2b-traffic-access-token
	// on requests to any port but envd's.
	TrafficToken string
	// MaskRequestHost, if set, replaces the Host of requests to any port
	// but envd's, with "${PORT}" replaced by the port.
	MaskRequestHost string
	// EnvdAccessToken is what envd wants in X-Access-Token. envd checks
	// it itself, but only once it runs: a paused sandbox is resumed by a
	// request to envd's port only if the request carries it.
	EnvdAccessToken string
	// Paused says the sandbox is paused and resumes on traffic: the proxy
	// calls Resolver.Resume once the request has shown its credentials.
	Paused bool
}

// Resolver finds sandboxes.
type Resolver interface {
	// Resolve finds a sandbox's target without changing anything. A
	// paused sandbox that does not resume on traffic is ErrNotFound.
	Resolve(ctx context.Context, sandboxID string) (Target, error)
	// Resume resumes a paused sandbox (it may block briefly); its
	// target is resolved again afterwards, since a resumed sandbox may
	// have a new address.
	Resume(ctx context.Context, sandboxID string) error
	// Track registers an exchange the proxy carries to a sandbox: when
	// the sandbox is killed or paused its owner calls end, which ends
	// the exchange at once; the proxy calls untrack when the exchange
	// ends by itself. A sandbox gone or paused meanwhile is ErrNotFound
	// or ErrTransitioning.
	Track(sandboxID string, end func()) (untrack func(), err error)
	// SignedBy finds the sandbox whose envd access token signed a URL:
	// it calls signed with the token of every sandbox Resolve would find
	// (all of them, whatever the answers, so that the time taken tells
	// nothing) and returns one for which it held, else ErrNotFound.
	SignedBy(signed func(envdAccessToken string) bool) (sandboxID string, err error)
}

// Config configures a Proxy.
type Config struct {
	// Domain is what clients put after {port}-{sandboxID}. in hosts.
	Domain   string
	Resolver Resolver
	// Now is the failure budget's clock; nil: time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Proxy is the sandbox proxy's HTTP handler.
type Proxy struct {
	cfg       Config
	log       *slog.Logger
	transport *http.Transport
	rp        *httputil.ReverseProxy
	// failures is each client address's budget of requests refused for
	// a wrong token; once spent, its further failures are 429s
	// (authFailed).
	failures *ratelimit.Keyed
}

// A client address may send authFailureBurst requests with a wrong token,
// then one a second.
const (
	authFailureRate  = 1
	authFailureBurst = 20
)

// NewTransport returns a transport suited to sandbox traffic: one
// sandbox's, or an api's to the nodes (wrapped in cluster.Auth.Transport).
// An answer that comes before the request body was sent wins over the
// failed write of the rest (answerfirst.go).
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         dialAnswerFirst((&net.Dialer{Timeout: 5 * time.Second}).DialContext),
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
}

type routeKey struct{}

// route is what the proxy learned about a request before forwarding it.
type route struct {
	sandboxID string
	port      int
	target    Target
}

// New returns a proxy.
func New(cfg Config) *Proxy {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, log: reqid.Logger(cfg.Logger), transport: NewTransport(),
		failures: &ratelimit.Keyed{Rate: authFailureRate, Burst: authFailureBurst, Now: cfg.Now}}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      roundTripper{p},
		FlushInterval:  -1,
		ModifyResponse: closeUnreadOnAnswer,
		ErrorHandler:   p.upstreamError,
		ErrorLog:       slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return p
}

// roundTripper sends each request through its sandbox's transport.
type roundTripper struct{ p *Proxy }

func (t roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	rt := r.Context().Value(routeKey{}).(*route).target.Transport
	if rt == nil {
		rt = t.p.transport
	}
	return rt.RoundTrip(r)
}

// ServeHTTP routes a request to its sandbox: it finds the sandbox, checks
// the request's token, and only then resumes a paused sandbox and
// forwards the request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every request has an ID in its context, which its log lines name
	// (here and in the sandbox manager a resume goes through); a response
	// carries it only when it is an error that points to the log.
	r = r.WithContext(reqid.NewContext(r.Context(), reqid.New()))
	defer recoverPanic(p.log, w, r)
	// The proxy's own answers (errors) can be read by a page calling a
	// sandbox from another origin (E2B's browser SDK): any origin, never
	// with credentials. What the sandbox answers keeps its own CORS
	// headers: this one is dropped before the exchange (upstreamError
	// sets it again on the proxy's answer when the exchange fails).
	cors := r.Header.Get("Origin") != ""
	if cors {
		w.Header().Set("Access-Control-Allow-Origin", "*")
	}
	client := ratelimit.ClientKey(r.RemoteAddr)
	id, port, err := ParseRoute(p.cfg.Domain, r.Host, r.Header)
	signed := false
	if err != nil && isPreflight(r) {
		// A browser's preflight carries none of the headers it asks
		// leave for (E2b-Sandbox-Id among them), so with E2B_SANDBOX_URL
		// (one address for every sandbox) nothing routes it. It is
		// answered with envd's own CORS grant: no credentials, and the
		// actual request still needs its route and envd's token.
		w.Header().Del("Access-Control-Allow-Origin")
		envdinfo.CORS(w, r)
		return
	}
	if err != nil {
		q, op, ok := signedFilesRequest(r)
		if !ok {
			writeError(w, http.StatusBadRequest, "", 0, err.Error())
			return
		}
		if id, err = p.cfg.Resolver.SignedBy(func(token string) bool { return q.Signed(op, token) }); err != nil {
			authFailed(w, p.failures, client, http.StatusUnauthorized, "", "invalid signature")
			return
		}
		port, signed = envdinfo.Port, true
	}
	traffic := r.Header.Values(trafficTokenHeader)
	if len(traffic) > 1 {
		writeError(w, http.StatusBadRequest, id, 0, "header "+trafficTokenHeader+" given more than once")
		return
	}
	t, err := p.cfg.Resolver.Resolve(r.Context(), id)
	if err != nil {
		p.resolveError(w, r, id, err)
		return
	}
	if !trafficAllowed(port, t.TrafficToken, strings.Join(traffic, "")) {
		authFailed(w, p.failures, client, http.StatusForbidden, id, "this sandbox's traffic needs its traffic access token in the e2b-traffic-access-token header")
		return
	}
	if t.Paused {
		if port == envdinfo.Port && !signed && !tokenMatches(t.EnvdAccessToken, r.Header.Values("X-Access-Token")) {
			authFailed(w, p.failures, client, http.StatusUnauthorized, id, "the sandbox is paused: a request to envd resumes it only with the sandbox's access token in X-Access-Token")
			return
		}
		if err := p.cfg.Resolver.Resume(r.Context(), id); err != nil {
			p.resolveError(w, r, id, err)
			return
		}
		// A resumed sandbox has a new address (a fresh network slot).
		if t, err = p.cfg.Resolver.Resolve(r.Context(), id); err != nil {
			p.resolveError(w, r, id, err)
			return
		}
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	untrack, err := p.cfg.Resolver.Track(id, func() { cancel(errSandboxEnded) })
	if err != nil {
		p.resolveError(w, r, id, err)
		return
	}
	defer untrack()
	rt := &route{sandboxID: id, port: port, target: t}
	// The upstream may answer before it has read the whole request body
	// (a Connect stream answers once it has the first message). Without
	// full duplex, net/http would then drain the body itself, racing the
	// transport that is still copying it upstream, which breaks the
	// upstream connection mid-response (and see duplex.go).
	r = fullDuplex(w, r.WithContext(context.WithValue(ctx, routeKey{}, rt)))
	if cors {
		w.Header().Del("Access-Control-Allow-Origin")
	}
	p.rp.ServeHTTP(w, r)
}

// isPreflight tells a CORS preflight.
func isPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

// errSandboxEnded is the cause that ends the exchanges of a sandbox being
// killed or paused.
var errSandboxEnded = errors.New("the sandbox was killed or paused")

// signedFilesRequest reports whether r is a GET or POST of envd's /files
// with a signature in its query, and returns the query and the operation
// the signature must be for.
func signedFilesRequest(r *http.Request) (filesig.Query, string, bool) {
	op := filesig.Operation(r.Method)
	if r.URL.Path != "/files" || op == "" {
		return filesig.Query{}, "", false
	}
	q, err := filesig.ParseQuery(r.URL.RawQuery)
	if err != nil || q.Signature == "" {
		return filesig.Query{}, "", false
	}
	return q, op, true
}

const trafficTokenHeader = "E2b-Traffic-Access-Token"

// resolveError answers a Resolver's error.
func (p *Proxy) resolveError(w http.ResponseWriter, r *http.Request, id string, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusBadGateway, id, 0, "The sandbox was not found")
	case errors.Is(err, ErrTransitioning):
		writeError(w, http.StatusConflict, id, 0, "The sandbox is changing state, retry shortly")
	case errors.Is(err, ErrTeamLimit):
		writeError(w, http.StatusTooManyRequests, id, 0, "The sandbox is paused and cannot resume: its team runs the most sandboxes it may at once (--max-sandboxes-per-team); kill or pause one of them, then retry")
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client left; nobody reads an answer.
	default:
		p.internal(w, r, id, err)
	}
}

// internal answers 500 naming only a request ID, under which the error
// is logged.
func (p *Proxy) internal(w http.ResponseWriter, r *http.Request, sandboxID string, err error) {
	internalError(p.log, w, r, sandboxID, err)
}

func internalError(log *slog.Logger, w http.ResponseWriter, r *http.Request, sandboxID string, err error) {
	rid := requestID(r)
	log.ErrorContext(r.Context(), "proxy request failed", reqid.LogKey, rid, "sandbox", sandboxID, "method", r.Method, "path", r.URL.Path, "err", err)
	w.Header().Set(reqid.Header, rid)
	writeError(w, http.StatusInternalServerError, "", 0, reqid.InternalMessage(rid))
}

// authFailed answers a request refused for a wrong token or signature:
// status with msg while client's budget of failures lasts (each spends
// it), then 429 with Retry-After. Only failures are refused so: a request
// with the right token is served from any address, since behind a load
// balancer every client may share one.
func authFailed(w http.ResponseWriter, failures *ratelimit.Keyed, client string, status int, sandboxID, msg string) {
	if blocked, wait := failures.Blocked(client); blocked {
		w.Header().Set("Retry-After", strconv.Itoa(ratelimit.RetryAfter(wait)))
		writeError(w, http.StatusTooManyRequests, "", 0, "too many requests with a wrong token from this address; retry later")
		return
	}
	failures.Spend(client)
	writeError(w, status, sandboxID, 0, msg)
}

// requestID is the ID ServeHTTP gave r; a fresh one if r did not pass
// through it (a test's direct call).
func requestID(r *http.Request) string {
	if id := reqid.FromContext(r.Context()); id != "" {
		return id
	}
	return reqid.New()
}

// recoverPanic, deferred, turns a panic into a 500, except the one
// ReverseProxy uses to abort a response already under way. It must be
// the deferred call itself: recover works only there.
func recoverPanic(log *slog.Logger, w http.ResponseWriter, r *http.Request) {
	if v := recover(); v != nil {
		if v == http.ErrAbortHandler {
			panic(v)
		}
		internalError(log, w, r, "", fmt.Errorf("panic: %v\n%s", v, debug.Stack()))
	}
}

// trafficAllowed reports whether a request to port passes the sandbox's
// traffic token check. envd's port is exempt (the SDK authenticates to envd
// with envd's own access token); this is apart from ServeHTTP so that the
// exemption is testable without listening on envdinfo.Port.
func trafficAllowed(port int, want, got string) bool {
	if port == envdinfo.Port || want == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// tokenMatches reports whether a header given once holds want.
func tokenMatches(want string, got []string) bool {
	return want != "" && len(got) == 1 && subtle.ConstantTimeCompare([]byte(got[0]), []byte(want)) == 1
}

// ParseRoute finds the sandbox and port a request is for: from headers
// E2b-Sandbox-Id and E2b-Sandbox-Port when either is present, else from
// host, which must be {port}-{sandboxID}.{domain} (any case, a trailing
// dot and a :port allowed). Every route it returns has a valid sandbox ID
// (ValidSandboxID) and a port in 1..65535.
func ParseRoute(domain, host string, h http.Header) (id string, port int, err error) {
	ids, ports := h.Values("E2b-Sandbox-Id"), h.Values("E2b-Sandbox-Port")
	if len(ids) > 0 || len(ports) > 0 {
		return routeByHeaders(ids, ports)
	}
	return routeByHost(domain, host)
}

func routeByHeaders(ids, ports []string) (string, int, error) {
	switch {
	case len(ids) == 0:
		return "", 0, errors.New("missing header E2b-Sandbox-Id")
	case len(ports) == 0:
		return "", 0, errors.New("missing header E2b-Sandbox-Port")
	case len(ids) > 1 || len(ports) > 1:
		return "", 0, errors.New("headers E2b-Sandbox-Id and E2b-Sandbox-Port must be given once each")
	}
	if !ValidSandboxID(ids[0]) {
		return "", 0, fmt.Errorf("invalid E2b-Sandbox-Id %q: a sandbox ID is lower-case letters and digits", ids[0])
	}
	port, ok := parsePort(ports[0])
	if !ok {
		return "", 0, fmt.Errorf("invalid E2b-Sandbox-Port %q: want a port from 1 to 65535", ports[0])
	}
	return ids[0], port, nil
}

func routeByHost(domain, host string) (string, int, error) {
	bad := func(why string) (string, int, error) {
		return "", 0, fmt.Errorf("cannot tell the sandbox from host %q (%s): use {port}-{sandboxID}.%s, or the E2b-Sandbox-Id and E2b-Sandbox-Port headers", host, why, domain)
	}
	name, ok := hostName(host)
	if !ok {
		return bad("not a host name")
	}
	domain, _ = hostName(domain)
	label, rest, _ := strings.Cut(name, ".")
	if domain != "" && rest != domain {
		// {port}-{id} must be the only label before the domain.
		return bad("not {port}-{sandboxID} directly under " + domain)
	}
	ps, id, _ := strings.Cut(label, "-")
	port, ok := parsePort(ps)
	if !ok {
		return bad("no port from 1 to 65535")
	}
	if !ValidSandboxID(id) {
		return bad("no sandbox ID")
	}
	return id, port, nil
}

// hostName is host in lower case without its :port and trailing dot, if
// it is an ASCII host name (IPv6 literals and anything else are not).
func hostName(host string) (string, bool) {
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		if _, ok := parsePort(host[i+1:]); !ok {
			return "", false
		}
		host = host[:i]
	}
	host = strings.TrimSuffix(host, ".")
	if host == "" || len(host) > 253 {
		return "", false
	}
	b := []byte(host)
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.':
		default:
			// Non-ASCII too: Unicode case folding would let "K" (the
			// Kelvin sign) stand for "k".
			return "", false
		}
	}
	return string(b), true
}

// parsePort reads a port: decimal digits without a sign or leading zero,
// 1..65535.
func parsePort(s string) (int, bool) {
	if len(s) == 0 || len(s) > 5 || s[0] == '0' {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n <= 65535
}

// ValidSandboxID reports whether id has a sandbox ID's shape: 1 to 63
// lower-case letters and digits (one DNS label without '-').
func ValidSandboxID(id string) bool {
	if len(id) == 0 || len(id) > 63 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(routeKey{}).(*route)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = net.JoinHostPort(rt.target.IP.String(), strconv.Itoa(rt.port))
	pr.Out.Host = pr.In.Host
	if rt.port != envdinfo.Port && rt.target.MaskRequestHost != "" {
		pr.Out.Host = strings.ReplaceAll(rt.target.MaskRequestHost, "${PORT}", strconv.Itoa(rt.port))
	}
	pr.Out.Header.Del("E2b-Sandbox-Id")
	pr.Out.Header.Del("E2b-Sandbox-Port")
	pr.Out.Header.Del(trafficTokenHeader)
	pr.SetXForwarded()
}

// upstreamError answers when the sandbox could not be reached or the
// exchange broke off.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	rt := r.Context().Value(routeKey{}).(*route)
	closeIfUnread(r.Context(), w.Header())
	if r.Header.Get("Origin") != "" {
		w.Header().Set("Access-Control-Allow-Origin", "*")
	}
	if errors.Is(context.Cause(r.Context()), errSandboxEnded) {
		writeError(w, http.StatusBadGateway, rt.sandboxID, 0, "The sandbox was not found")
		return
	}
	if r.Context().Err() != nil {
		// The client left: not an error, and nobody reads an answer.
		p.log.DebugContext(r.Context(), "sandbox client went away", "sandbox", rt.sandboxID, "port", rt.port, "err", err)
		return
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED) {
		writeError(w, http.StatusBadGateway, rt.sandboxID, rt.port, "The sandbox is running but port is not open")
		return
	}
	// The error names addresses inside the node: it goes to the log only.
	rid := requestID(r)
	p.log.WarnContext(r.Context(), "sandbox request failed", reqid.LogKey, rid, "sandbox", rt.sandboxID, "port", rt.port, "err", err)
	w.Header().Set(reqid.Header, rid)
	writeError(w, http.StatusBadGateway, rt.sandboxID, rt.port, "sandbox request failed (request "+rid+")")
}

// writeError writes E2B's proxy error body: code and message, and the
// sandbox and port when known.
func writeError(w http.ResponseWriter, status int, sandboxID string, port int, msg string) {
	body := map[string]any{"code": status, "message": msg}
	if sandboxID != "" {
		body["sandboxId"] = sandboxID
	}
	if port != 0 {
		body["port"] = port
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
