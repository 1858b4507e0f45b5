package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/api"
	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/dispatch"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/store"
)

// The roles of `warren serve --role`.
const (
	// RoleAll is one box: the API, the proxy and the sandboxes in one
	// process, without a network hop between them.
	RoleAll = "all"
	// RoleAPI serves the platform API and the sandbox proxy of a cluster;
	// its sandboxes run on the nodes (internal/dispatch).
	RoleAPI = "api"
	// RoleNode runs a cluster's sandboxes and serves them to the api
	// processes at --node-addr (internal/noderpc).
	RoleNode = "node"
)

// clusterParts is what the api and node roles share: the cluster's
// request authentication and the sealer of team secrets, both from the
// cluster secret.
type clusterParts struct {
	auth   *cluster.Auth
	sealer *secret.Sealer
}

// checkRole validates the role's settings; for the api and node roles it
// returns the cluster parts.
func checkRole(cfg *Config) (*clusterParts, error) {
	if cfg.Role == "" {
		cfg.Role = RoleAll
	}
	switch cfg.Role {
	case RoleAll:
		if cfg.NodeAddr != "" {
			return nil, errors.New("--node-addr is for --role node: a --role all server serves its own sandboxes")
		}
		return nil, nil
	case RoleAPI, RoleNode:
	default:
		return nil, fmt.Errorf("--role %q: want all, api or node", cfg.Role)
	}
	if !strings.HasPrefix(cfg.StoreURL, "postgres://") && !strings.HasPrefix(cfg.StoreURL, "postgresql://") {
		return nil, fmt.Errorf("--role %s shares its state with the cluster's other processes: give --store postgres://… (SQLite is one process's file)", cfg.Role)
	}
	if cfg.Role == RoleNode && cfg.NodeAddr == "" {
		return nil, errors.New("--role node needs --node-addr HOST:PORT, where the api processes reach it")
	}
	if cfg.Role == RoleNode && cfg.NodeName == "local" {
		return nil, errors.New("--role node needs its own --node-name, unique in the cluster")
	}
	if cfg.Role == RoleNode && cfg.AdminAddr != "" {
		return nil, errors.New("--admin-addr is for --role all or api: a node serves no dashboard")
	}
	if cfg.Role == RoleAPI && cfg.NodeAddr != "" {
		return nil, errors.New("--node-addr is for --role node")
	}
	if cfg.Role == RoleAPI && cfg.BuildCodeInterpreter {
		return nil, errors.New("--build-code-interpreter is for --role all or node: templates are built where sandboxes run")
	}
	secretBytes, err := cluster.LoadSecret(cfg.ClusterSecretFile)
	if err != nil {
		return nil, err
	}
	if secretBytes == nil {
		return nil, fmt.Errorf("--role %s needs the cluster secret: --cluster-secret-file FILE or WARREN_CLUSTER_SECRET (the same in every process, e.g. `openssl rand -hex 32`)", cfg.Role)
	}
	a, err := cluster.NewAuth(secretBytes)
	if err != nil {
		return nil, err
	}
	skew, err := testClockOffset()
	if err != nil {
		return nil, err
	}
	if skew != 0 {
		a.SkewClock(skew)
	}
	sealer, err := secret.SealerFromClusterSecret(secretBytes)
	if err != nil {
		return nil, err
	}
	return &clusterParts{auth: a, sealer: sealer}, nil
}

// runAPI serves the platform API and the sandbox proxy of a cluster: no
// runtime, network or image store here; every sandbox call goes to the
// sandbox's node, and the proxy forwards to it.
func runAPI(ctx context.Context, cfg Config, cl *clusterParts, log *slog.Logger, out io.Writer) error {
	ls, err := listenPublic(cfg)
	if err != nil {
		return err
	}
	defer ls.close()
	met := metrics.New()
	st, err := openSecured(ctx, cfg, met, log)
	if err != nil {
		return err
	}
	defer st.Close()
	creds, err := auth.Bootstrap(ctx, st, cfg.DataDir, os.Getenv("WARREN_API_KEY"), os.Getenv("WARREN_ACCESS_TOKEN"))
	if err != nil {
		return err
	}
	printCredentials(out, creds)
	webhooks, stopWebhooks := startWebhooks(ctx, cfg, st, cl.sealer, met, log)
	defer stopWebhooks()
	// Connections to the nodes: one pool for calls, one for the sandbox
	// traffic forwarded to them, whose answers may come before its
	// request bodies were sent (proxy.NewTransport).
	nodeTransport := noderpc.NewTransport(cl.auth)
	disp, err := dispatch.New(dispatch.Config{Store: st, Transport: nodeTransport, LostAfter: cfg.LostAfter, PlacementTimeout: cfg.PlacementTimeout,
		MaxPerTeam: cfg.MaxPerTeam, Logger: log})
	if err != nil {
		return err
	}
	// Team volumes: the same --volume-root as the nodes', on storage they
	// share (docs/cluster.md).
	vols, err := openVolumes(cfg, st, log)
	if err != nil {
		return err
	}
	// Templates are served by nodes (disp.Platform forwards their routes).
	apiSrv := api.NewHTTPServer(disp.Platform(api.New(api.Config{
		MaxTimeout: cfg.MaxSandboxTimeout,
		Store:      st, Sandboxes: disp, Secrets: secret.New(st, cl.sealer), Volumes: vols, Webhooks: webhooks, ClientID: "api", Logger: log,
		// Sandboxes are made on nodes, which check their own disks; what
		// the api fills itself is the volume root (shared storage).
		RateLimit: cfg.APIRateLimit, DiskReserveMB: cfg.DiskReserveMB, VolumeFreeDiskMB: volumeFreeMB(cfg),
		TeamDiskQuotaMB: cfg.TeamDiskQuotaMB, VolumeQuotaMB: int64(cfg.VolumeQuotaMB),
		JWKS: clusterJWKS(st), IdentityIssuer: issuer(cfg),
	})), api.Timeouts{})
	proxyHandler := met.Proxy(proxy.NewForwarder(proxy.ForwardConfig{Domain: cfg.Domain, Locate: disp.Locate, SignedBy: disp.SignedBy,
		Transport: cl.auth.Transport(proxy.NewTransport()), ClientAddrHeader: noderpc.ClientAddrHeader, Logger: log}))
	srvs, certs, err := publicServers(cfg, st, cl.sealer, ls, apiSrv, proxyHandler)
	if err != nil {
		return err
	}
	if ls.metrics != nil {
		srvs = append(srvs, served{met.NewHTTPServer(), ls.metrics, false})
	}
	log.Info("warren is serving (role api)", "api", "http://"+ls.api.Addr().String(), "proxy", "http://"+ls.proxy.Addr().String(),
		"proxy_tls", tlsAddrs(ls.tls), "lost_after", cfg.LostAfter)
	printExports(out, cfg, ls.api.Addr(), ls.proxy.Addr(), creds, ls.tls, certs)
	return serveUntil(ctx, log, srvs)
}

// nodeAddr finds a node's internal address in the store.
func nodeAddr(st store.NodeStore) func(ctx context.Context, name string) (string, error) {
	return func(ctx context.Context, name string) (string, error) {
		n, err := st.GetNode(ctx, name)
		if err != nil {
			return "", err
		}
		if n.Address == "" {
			return "", fmt.Errorf("node %s has no internal address", name)
		}
		return n.Address, nil
	}
}

// listeners are the public addresses of the api and all roles.
type listeners struct {
	api, proxy, metrics, admin net.Listener
	tls                        []net.Listener
}

func (l *listeners) close() {
	for _, ln := range append([]net.Listener{l.api, l.proxy, l.metrics, l.admin}, l.tls...) {
		if ln != nil {
			ln.Close()
		}
	}
}

// listenPublic listens on the API, proxy, TLS proxy and metrics
// addresses: a taken port fails before anything is started.
func listenPublic(cfg Config) (*listeners, error) {
	l := &listeners{}
	var err error
	if l.api, err = net.Listen("tcp", cfg.APIAddr); err != nil {
		return nil, err
	}
	if l.proxy, err = net.Listen("tcp", cfg.ProxyAddr); err != nil {
		l.close()
		return nil, err
	}
	if l.tls, err = listenTLS(cfg); err != nil {
		l.close()
		return nil, err
	}
	if l.metrics, err = listenMetrics(cfg); err != nil {
		l.close()
		return nil, err
	}
	if l.admin, err = listenAdmin(cfg); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// served is a server and the listener it serves.
type served struct {
	srv *http.Server
	ln  net.Listener
	tls bool
}

// serveUntil serves srvs until ctx ends or one fails, then shuts them
// down: the first (the API) gracefully, the others at once, since
// sandbox streams (a command's output) may be open for hours.
func serveUntil(ctx context.Context, log *slog.Logger, srvs []served) error {
	errc := make(chan error, len(srvs))
	for _, s := range srvs {
		go func() {
			if s.tls {
				errc <- s.srv.ServeTLS(s.ln, "", "")
			} else {
				errc <- s.srv.Serve(s.ln)
			}
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	log.Info("shutting down; running sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, s := range srvs {
		if i == 0 {
			_ = s.srv.Shutdown(sctx)
		} else {
			_ = s.srv.Close()
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func printCredentials(out io.Writer, creds *auth.Credentials) {
	if creds != nil {
		fmt.Fprintf(out, "First start: created an API key and an access token. They are shown only now, and kept in %s (mode 0600).\n", creds.File)
		fmt.Fprintf(out, "  API key:      %s\n  access token: %s\n", creds.APIKey, creds.AccessToken)
	}
}

// reserveForTeam is a node's claim of a place in a team's limit for a
// resume by proxy traffic (sandbox.Config.ReserveForTeam): in the shared
// store, against its --max-sandboxes-per-team, as the api processes claim
// for what they send (so give nodes and apis the same limit). None but in
// a cluster's node, or without a limit: a single server's own count is
// the team's whole count.
func reserveForTeam(cfg Config, st store.ClaimStore, log *slog.Logger) func(context.Context, string) (func(), error) {
	if cfg.Role != RoleNode || cfg.MaxPerTeam <= 0 {
		return nil
	}
	return dispatch.Claimer(st, cfg.MaxPerTeam, nil, log)
}

// testClockOffset is WARREN_TEST_CLOCK_OFFSET (a Go duration, e.g. 90s or
// -30s): a test-only skew of this process's cluster clock (its request
// signatures and their checks, and a node's heartbeat times), so that the
// chaos run (docs/chaos.md) skews a node without changing the host's
// clock. Unset: none.
func testClockOffset() (time.Duration, error) {
	v := os.Getenv("WARREN_TEST_CLOCK_OFFSET")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("WARREN_TEST_CLOCK_OFFSET: %w", err)
	}
	return d, nil
}
