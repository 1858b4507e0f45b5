package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/ratelimit"
	"github.com/warren-sandbox/warren/internal/reqid"
)

// ForwardConfig configures a Forwarder.
type ForwardConfig struct {
	// Domain is what clients put after {port}-{sandboxID}. in hosts.
	Domain string
	// Locate finds the name and internal address (HOST:PORT) of the node
	// that runs a sandbox: ErrNotFound when the sandbox or its node is
	// gone.
	Locate func(ctx context.Context, sandboxID string) (node, addr string, err error)
	// SignedBy is Resolver.SignedBy over the cluster's sandboxes.
	SignedBy func(signed func(envdAccessToken string) bool) (string, error)
	// Transport reaches the nodes and authenticates to them
	// (cluster.Auth.Transport): each request is signed as sandbox
	// traffic (cluster.PurposeTraffic) for the sandbox's node, so the
	// node serves it as such whatever its path.
	Transport http.RoundTripper
	// ClientAddrHeader carries the client's address to the node.
	ClientAddrHeader string
	Now              func() time.Time
	Logger           *slog.Logger
}

// Forwarder is the sandbox proxy of an api process (`--role api`): it
// tells a request's sandbox as Proxy does and forwards the request to the
// node that runs it, where the node's Proxy checks the tokens, resumes a
// paused sandbox, tracks the exchange (a killed sandbox's streams end
// there, and so here) and reaches the sandbox. Routes by host travel as
// the E2b-Sandbox-Id and -Port headers, so a node needs no domain.
type Forwarder struct {
	cfg      ForwardConfig
	log      *slog.Logger
	rp       *httputil.ReverseProxy
	failures *ratelimit.Keyed
}

type forwardKey struct{}

// NewForwarder returns a Forwarder.
func NewForwarder(cfg ForwardConfig) *Forwarder {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Forwarder{cfg: cfg, log: reqid.Logger(cfg.Logger),
		failures: &ratelimit.Keyed{Rate: authFailureRate, Burst: authFailureBurst, Now: cfg.Now}}
	f.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = pr.In.Context().Value(forwardKey{}).(string)
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set(cfg.ClientAddrHeader, pr.In.RemoteAddr)
		},
		Transport:      cfg.Transport,
		FlushInterval:  -1,
		ModifyResponse: closeUnreadOnAnswer,
		ErrorHandler:   f.upstreamError,
		ErrorLog:       slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return f
}

// ServeHTTP forwards a request to its sandbox's node.
func (f *Forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = r.WithContext(reqid.NewContext(r.Context(), reqid.New()))
	defer recoverPanic(f.log, w, r)
	client := ratelimit.ClientKey(r.RemoteAddr)
	id, port, err := ParseRoute(f.cfg.Domain, r.Host, r.Header)
	if err != nil {
		q, op, ok := signedFilesRequest(r)
		if !ok {
			writeError(w, http.StatusBadRequest, "", 0, err.Error())
			return
		}
		// The node finds the sandbox by the signature again, among its own.
		if id, err = f.cfg.SignedBy(func(token string) bool { return q.Signed(op, token) }); err != nil {
			authFailed(w, f.failures, client, http.StatusUnauthorized, "", "invalid signature")
			return
		}
	} else {
		r.Header.Set("E2b-Sandbox-Id", id)
		r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	}
	node, addr, err := f.cfg.Locate(r.Context(), id)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			writeError(w, http.StatusBadGateway, id, 0, "The sandbox was not found")
			return
		}
		f.internal(w, r, id, err)
		return
	}
	ctx := cluster.WithTarget(cluster.WithPurpose(r.Context(), cluster.PurposeTraffic), node)
	r = fullDuplex(w, r.WithContext(context.WithValue(ctx, forwardKey{}, addr))) // see Proxy.ServeHTTP
	f.rp.ServeHTTP(w, r)
}

// upstreamError answers when the node could not be reached or the
// exchange broke off.
func (f *Forwarder) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	closeIfUnread(r.Context(), w.Header())
	id := r.Header.Get("E2b-Sandbox-Id")
	if r.Context().Err() != nil {
		return // the client left
	}
	rid := requestID(r)
	f.log.WarnContext(r.Context(), "forwarding to the sandbox's node failed", reqid.LogKey, rid, "sandbox", id, "err", err)
	w.Header().Set(reqid.Header, rid)
	writeError(w, http.StatusBadGateway, id, 0, "the sandbox's node did not answer (request "+rid+")")
}

func (f *Forwarder) internal(w http.ResponseWriter, r *http.Request, sandboxID string, err error) {
	internalError(f.log, w, r, sandboxID, err)
}
