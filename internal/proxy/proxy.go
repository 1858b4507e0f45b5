// Package proxy carries sandbox traffic: the SDK's envd calls (Connect RPC
// and /files on port 49983) and users' traffic to any port inside a
// sandbox. It never goes through the platform API's handlers.
//
// Routing follows E2B's proxy. A request that carries E2b-Sandbox-Id or
// E2b-Sandbox-Port (the SDK always sends both on envd calls, which is what
// makes E2B_SANDBOX_URL work) is routed by those headers; any other by its
// Host, {port}-{sandboxID}.{domain}. Errors are JSON with the status as
// code: 400 for a request that names no sandbox, 502 when the sandbox is
// gone (the SDK reads that as "not running") or its port is closed, 409
// while it changes state, 403 for a missing traffic token.
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
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EnvdPort is envd's port in every sandbox.
const EnvdPort = 49983

// Errors a Resolver returns (possibly wrapped).
var (
	ErrNotFound      = errors.New("sandbox not found")
	ErrTransitioning = errors.New("sandbox is changing state")
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
}

// Resolver finds sandboxes. Resolve may block briefly (to resume one).
type Resolver interface {
	Resolve(ctx context.Context, sandboxID string) (Target, error)
}

// Config configures a Proxy.
type Config struct {
	// Domain is what clients put after {port}-{sandboxID}. in hosts.
	Domain   string
	Resolver Resolver
	Logger   *slog.Logger
}

// Proxy is the sandbox proxy's HTTP handler.
type Proxy struct {
	cfg       Config
	log       *slog.Logger
	transport *http.Transport
	rp        *httputil.ReverseProxy
}

// NewTransport returns a transport suited to one sandbox's traffic.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
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
	p := &Proxy{cfg: cfg, log: cfg.Logger, transport: NewTransport()}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     roundTripper{p},
		FlushInterval: -1,
		ErrorHandler:  p.upstreamError,
		ErrorLog:      slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
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

// ServeHTTP routes a request to its sandbox.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, err := p.parse(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "", 0, err.Error())
		return
	}
	t, err := p.cfg.Resolver.Resolve(r.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusBadGateway, id, 0, "The sandbox was not found")
		return
	case errors.Is(err, ErrTransitioning):
		writeError(w, http.StatusConflict, id, 0, "The sandbox is changing state, retry shortly")
		return
	case err != nil:
		writeError(w, http.StatusBadGateway, id, 0, err.Error())
		return
	}
	if !trafficAllowed(port, t.TrafficToken, r.Header.Get("e2b-traffic-access-token")) {
		writeError(w, http.StatusForbidden, id, 0, "this sandbox's traffic needs its traffic access token in the e2b-traffic-access-token header")
		return
	}
	rt := &route{sandboxID: id, port: port, target: t}
	// The upstream may answer before it has read the whole request body
	// (a Connect stream answers once it has the first message). Without
	// full duplex, net/http would then drain the body itself, racing the
	// transport that is still copying it upstream, which breaks the
	// upstream connection mid-response.
	_ = http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, rt)))
}

// trafficAllowed reports whether a request to port passes the sandbox's
// traffic token check. envd's port is exempt (the SDK authenticates to envd
// with envd's own access token); this is apart from ServeHTTP so that the
// exemption is testable without listening on EnvdPort.
func trafficAllowed(port int, want, got string) bool {
	if port == EnvdPort || want == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// parse finds the sandbox and port a request is for.
func (p *Proxy) parse(r *http.Request) (id string, port int, err error) {
	hid, hport := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	if hid != "" || hport != "" {
		if hid == "" {
			return "", 0, errors.New("missing header E2b-Sandbox-Id")
		}
		if hport == "" {
			return "", 0, errors.New("missing header E2b-Sandbox-Port")
		}
		port, err := strconv.Atoi(hport)
		if err != nil || port < 1 || port > 65535 {
			return "", 0, fmt.Errorf("invalid E2b-Sandbox-Port %q", hport)
		}
		return hid, port, nil
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, _, _ := strings.Cut(host, ".")
	ps, id, ok := strings.Cut(label, "-")
	port, perr := strconv.Atoi(ps)
	if !ok || id == "" || perr != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("cannot tell the sandbox from host %q: use {port}-{sandboxID}.%s, or the E2b-Sandbox-Id and E2b-Sandbox-Port headers", r.Host, p.cfg.Domain)
	}
	return id, port, nil
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(routeKey{}).(*route)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = net.JoinHostPort(rt.target.IP.String(), strconv.Itoa(rt.port))
	pr.Out.Host = pr.In.Host
	if rt.port != EnvdPort && rt.target.MaskRequestHost != "" {
		pr.Out.Host = strings.ReplaceAll(rt.target.MaskRequestHost, "${PORT}", strconv.Itoa(rt.port))
	}
	pr.Out.Header.Del("E2b-Sandbox-Id")
	pr.Out.Header.Del("E2b-Sandbox-Port")
	pr.Out.Header.Del("e2b-traffic-access-token")
	pr.SetXForwarded()
}

// upstreamError answers when the sandbox could not be reached or the
// exchange broke off.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	rt := r.Context().Value(routeKey{}).(*route)
	if r.Context().Err() != nil {
		// The client left: not an error, and nobody reads an answer.
		p.log.Debug("sandbox client went away", "sandbox", rt.sandboxID, "port", rt.port, "err", err)
		return
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED) {
		writeError(w, http.StatusBadGateway, rt.sandboxID, rt.port, "The sandbox is running but port is not open")
		return
	}
	p.log.Debug("sandbox request failed", "sandbox", rt.sandboxID, "port", rt.port, "err", err)
	writeError(w, http.StatusBadGateway, rt.sandboxID, rt.port, "sandbox request failed: "+err.Error())
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
