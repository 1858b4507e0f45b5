// Package server assembles and runs `warren serve`: it claims the host
// settings of its data dir (claims.go: another live server's are never
// touched), opens the store, the image store and root filesystems, builds
// the node (runtime, network, envd), the template builder, the sandbox
// manager, the API and the proxy (plain, and over TLS with
// internal/ingress), serves until its context ends, and shuts them down.
// In a cluster (roles.go) an api process has no node and sends sandbox
// calls to the node processes, which serve them on their internal
// address. cmd/warren only parses the flags into a Config.
package server

import (
	"context"
	"errors"
	"fmt"
	"github.com/warren-sandbox/warren/internal/blobstore"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/api"
	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/clientaddr"
	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/dashboard"
	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/hostres"
	"github.com/warren-sandbox/warren/internal/identity"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/imageblob"
	"github.com/warren-sandbox/warren/internal/imagepeer"
	"github.com/warren-sandbox/warren/internal/ingress"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/reqid"
	"github.com/warren-sandbox/warren/internal/resolvconf"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
	"github.com/warren-sandbox/warren/internal/volume"
)

// Config is `warren serve`'s flags (see cmd/warren for their defaults and
// meaning).
type Config struct {
	DataDir, StoreURL, APIAddr, ProxyAddr, Domain string
	// ProxyTLSAddrs are where the proxy also listens with TLS (none: no
	// TLS); TLSCert and TLSKey its certificate, else the local CA's.
	ProxyTLSAddrs                                 []string
	TLSCert, TLSKey                               string
	Runtime, Envd, RunDir, CgroupParent           string
	NetworkCIDR, NetworkPrefix, NodeName          string
	RegistryMirror                                string
	ResolvConf                                    string
	AllowPrivate                                  network.PrefixList
	MaxSandboxes, MaxPerTeam, PoolSize            int
	PoolMaxMemoryMB                               int
	BuildConcurrency                              int
	MemoryOvercommit, CPUOvercommit, APIRateLimit float64
	DiskReserveMB                                 int64
	PausedRetention                               time.Duration
	// BlobStore, if its URL is set, keeps paused sandboxes in a blob
	// store (internal/blobstore) so that any node resumes them.
	BlobStore blobstore.Options
	// BlobCacheMB bounds the paused sandboxes' copies a node keeps
	// beside the blob store (sandbox.Config.BlobCacheMB).
	BlobCacheMB int
	// MaxSandboxTimeout bounds every sandbox term a client asks for
	// (api.Config.MaxTimeout, sandbox.Config.MaxTimeout); 0: 24 h.
	MaxSandboxTimeout  time.Duration
	MaxUploadMB        int
	InsecureRegistries []string
	InsecureRuntime    bool
	BuildDiskMB        int
	// EgressProxyPort is the host port of the egress proxy (every
	// address; only redirected sandbox connections are let in); 0 picks
	// a free one at each start.
	EgressProxyPort int
	// EgressCAFile, if set, holds PEM root certificates the egress proxy
	// trusts, beside the system's, when it re-encrypts to a host that has
	// rules (an internal service's CA).
	EgressCAFile string
	// IdentityTrustDomain is the SPIFFE trust domain of sandboxes'
	// workload identity tokens (default: Domain); every process of a
	// cluster takes the same. IdentityIssuer, if set, is their iss (the
	// API's public URL), and the API then serves OpenID discovery.
	IdentityTrustDomain, IdentityIssuer string
	// VolumeRoot holds team volumes (default DATA/volumes); VolumeQuotaMB
	// sizes new ones (0: no quota); MaxVolumesPerTeam bounds a team's.
	VolumeRoot                       string
	VolumeQuotaMB, MaxVolumesPerTeam int
	// TeamDiskQuotaMB bounds a team's volumes, paused sandboxes,
	// templates and snapshots on the nodes' disks (api.Config); 0: none.
	TeamDiskQuotaMB int64
	// MetricsAddr is where Prometheus metrics are served (/metrics), on
	// a listener of their own; empty: not served.
	MetricsAddr string
	// AdminAddr is where the dashboard is served with its nodes page, to
	// the admin token (DATA-DIR/admin-token), on a listener of its own;
	// empty: not served.
	AdminAddr string
	// Role is RoleAll (default), RoleAPI or RoleNode (roles.go).
	Role string
	// NodeAddr is where a node serves the api processes.
	NodeAddr string
	// ClusterSecretFile holds the cluster secret (else
	// $WARREN_CLUSTER_SECRET); api and node roles need one.
	ClusterSecretFile string
	// LostAfter is how long an api waits for a node's heartbeat before
	// the node is lost.
	LostAfter time.Duration
	// PlacementTimeout bounds an api's placement of a create on the
	// nodes (504 sandbox_placement_timeout past it); 0: no bound.
	PlacementTimeout time.Duration
	// NodeLabels label this node in the store (`warren nodes`).
	NodeLabels map[string]string
	// SandboxMaxConns bounds the connections each sandbox may have open
	// at once, SandboxConnRate the new ones it may open per second
	// (burst twice that); 0: no bound (network.Config's negative).
	SandboxMaxConns, SandboxConnRate int
	// SandboxDiskReadMBps, SandboxDiskWriteMBps (MiB/s) and
	// SandboxDiskIOPS (each way) bound each sandbox's IO on the block
	// device of its disk; 0: no bound.
	SandboxDiskReadMBps, SandboxDiskWriteMBps, SandboxDiskIOPS int
	// TrustedProxies are the load balancers whose PROXY protocol header
	// or X-Forwarded-For says who the client is (internal/clientaddr);
	// none: every TCP peer is the client.
	TrustedProxies clientaddr.Prefixes
	// BuildCodeInterpreter builds the code-interpreter-v1 template in the
	// background while serving, when it is missing or of an old recipe
	// (setup.Background; `make run` does this rather than wait for it in
	// `warren setup`). Roles all and node.
	BuildCodeInterpreter bool
	// CodeInterpreterSnapshot takes code-interpreter-v1's start snapshot
	// (running kernels) once the template exists, so that its sandboxes
	// are restored rather than booted. Roles all and node.
	CodeInterpreterSnapshot bool
	// WebhookAllow are the internal ranges (loopback, private,
	// link-local) webhook URLs may reach; none by default.
	WebhookAllow network.PrefixList
	// WebhookTimeout bounds each delivery attempt, WebhookRetryInterval
	// the wait before a retry (E2B: 10 s); MaxWebhooksPerTeam a team's
	// webhooks; EventRetention how long lifecycle events are kept.
	WebhookTimeout, WebhookRetryInterval, EventRetention time.Duration
	MaxWebhooksPerTeam                                   int
	// Stdout gets what serve prints for its user: the first start's
	// credentials and the SDK's exports. Default os.Stdout.
	Stdout io.Writer
}

// Run serves with cfg in its role (roles.go: all, api or node) until ctx
// ends (or a server fails), then shuts its servers down; sandboxes keep
// running. log gets the server's log (NewLogger makes it).
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	log = reqid.Logger(log) // lines about a request name it, whatever log is
	out := cfg.Stdout
	if out == nil {
		out = os.Stdout
	}
	cl, err := checkRole(&cfg)
	if err != nil {
		return err
	}
	if cfg.Role == RoleAPI {
		return runAPI(ctx, cfg, cl, log, out)
	}
	if err := checkRuntime(cfg.Runtime, cfg.InsecureRuntime); err != nil {
		return err
	}
	if err := hostDefaults(&cfg); err != nil {
		return err
	}
	// Listen first: a taken port should fail before anything is started.
	// A node serves only its internal address (and metrics); the API and
	// the proxy are its api processes'.
	ls := &listeners{}
	if cfg.Role == RoleNode {
		if ls.metrics, err = listenMetrics(cfg); err != nil {
			return err
		}
	} else if ls, err = listenPublic(cfg); err != nil {
		return err
	}
	defer ls.close()
	var nodeLn net.Listener
	if cfg.Role == RoleNode {
		if nodeLn, err = net.Listen("tcp", cfg.NodeAddr); err != nil {
			return fmt.Errorf("--node-addr: %w", err)
		}
		defer nodeLn.Close()
	}
	// Always collected (cheap); served only with --metrics-addr.
	met := metrics.New()

	// Before anything on the host is touched: another live server's
	// names and range are never ours to clean up.
	releaseClaims, err := claimHost(cfg)
	if err != nil {
		return err
	}
	defer releaseClaims()
	log.Info("host settings claimed", "data_dir", cfg.DataDir, "network_prefix", cfg.NetworkPrefix, "network_cidr", cfg.NetworkCIDR,
		"run_dir", cfg.RunDir, "cgroup_parent", cfg.CgroupParent)

	st, err := openSecured(ctx, cfg, met, log)
	if err != nil {
		return err
	}
	defer st.Close()
	var creds *auth.Credentials
	if cfg.Role == RoleAll { // a cluster's credentials are its api processes'
		if creds, err = auth.Bootstrap(ctx, st, cfg.DataDir, os.Getenv("WARREN_API_KEY"), os.Getenv("WARREN_ACCESS_TOKEN")); err != nil {
			return err
		}
		printCredentials(out, creds)
	}

	images, err := openImages(cfg)
	if err != nil {
		return err
	}
	envd, err := findEnvd(cfg.Envd)
	if err != nil {
		return err
	}
	ensureMCPGateway(ctx, images, filepath.Join(filepath.Dir(envd), "mcp-gateway"), log)
	// Team secrets are sealed under the node key, or in a cluster under
	// the cluster secret, which every process holds.
	var sealer *secret.Sealer
	if cl != nil {
		sealer = cl.sealer
	} else if sealer, err = secret.LoadSealer(cfg.DataDir); err != nil {
		return err
	}
	secrets := secret.New(st, sealer)
	webhooks, stopWebhooks := startWebhooks(ctx, cfg, st, sealer, met, log)
	defer stopWebhooks()
	eg, err := openEgress(cfg, secrets, log)
	if err != nil {
		return err
	}
	defer eg.close()
	// The node's workload identity key, kept in the data dir like its
	// other keys; its public half is registered with the node below.
	if eg.identity, err = identity.LoadSigner(cfg.DataDir, trustDomain(cfg), issuer(cfg)); err != nil {
		return fmt.Errorf("workload identity (--identity-trust-domain): %w", err)
	}
	n, nw, err := newNode(cfg, images, envd, eg, log)
	if err != nil {
		return err
	}
	defer nw.Close()
	if cfg.MaxUploadMB <= 0 {
		return fmt.Errorf("--max-upload-mb must be positive")
	}
	var mgr *sandbox.Manager   // made below, before anything is served
	var member *cluster.Member // likewise, once the manager has started
	var pull func(ctx context.Context, node, imageID string) error
	if cfg.Role == RoleNode {
		// A template built on another node is pulled from it.
		pull = (&imagepeer.Puller{Images: images, Transport: noderpc.NewTransport(cl.auth), Addr: nodeAddr(st)}).Pull
	}
	var ciBuild *setup.Background
	var pending func(string) string
	if cfg.BuildCodeInterpreter {
		ciBuild = setup.NewCodeInterpreterBuild(images, log)
		pending = ciBuild.Pending
	}
	builder, err := template.New(template.Config{
		Store: st, Images: images, Node: n, NodeName: cfg.NodeName, Pull: pull, Concurrency: cfg.BuildConcurrency, Pending: pending,
		RegistryMirror: cfg.RegistryMirror, InsecureRegistries: cfg.InsecureRegistries,
		MaxUploadBytes: int64(cfg.MaxUploadMB) << 20, BuildDiskMB: cfg.BuildDiskMB, Logger: log,
		Observer: met, ImageRemoved: func(id string) { mgr.ForgetTemplate(id) }, Sealer: sealer,
	})
	if err != nil {
		return err
	}
	totals, err := hostres.Read()
	if err != nil {
		return err
	}
	// Host-wide and left raised at exit, like IPv4 forwarding.
	if was, is, err := hostres.RaisePidMax("/proc/sys/kernel/pid_max", hostres.PidMaxWanted); err != nil {
		log.Warn("the host's kernel.pid_max stays as it is: sandboxes need ~29 host tasks each", "err", err)
	} else if is != was {
		log.Info("raised the host's kernel.pid_max: sandboxes need ~29 host tasks each", "was", was, "now", is)
	}
	dataDir := cfg.DataDir
	freeMB := func() (int64, error) { return hostres.FreeMB(dataDir) }
	vols, err := openVolumes(cfg, st, log)
	if err != nil {
		return err
	}
	blobs, blobTemp, err := openBlobStore(ctx, cfg, met, log)
	if err != nil {
		return err
	}
	if blobs != nil {
		// Built templates' images are kept there too.
		builder.UseBlobStore(&imageblob.Keeper{Blobs: blobs, Images: images, Temp: blobTemp, Log: log})
	}
	mgr, err = sandbox.New(sandbox.Config{
		Blobs: blobs, BlobTemp: blobTemp, BlobCacheMB: cfg.BlobCacheMB, MaxTimeout: cfg.MaxSandboxTimeout, NodeLostAfter: cfg.LostAfter,
		Store: st, Node: n, Images: images, NodeName: cfg.NodeName,
		MaxSandboxes: cfg.MaxSandboxes, MaxPerTeam: cfg.MaxPerTeam, PoolSize: cfg.PoolSize, Logger: log,
		PoolMaxMemoryMB: cfg.PoolMaxMemoryMB,
		Resolve:         builder.SandboxTemplate, Volumes: vols,
		NodeCPUs: totals.CPUs, NodeMemoryMB: totals.MemoryMB,
		CPUOvercommit: cfg.CPUOvercommit, MemoryOvercommit: cfg.MemoryOvercommit, PausedRetention: cfg.PausedRetention,
		DiskReserveMB: cfg.DiskReserveMB, FreeDiskMB: freeMB,
		Sealer: sealer, CheckEgressProxy: eg.checkUpstream, Audit: eg.audit, ReserveForTeam: reserveForTeam(cfg, st, log),
		Observer: met, Admit: func(ctx context.Context) error {
			if member == nil { // not yet joined: nothing is served yet
				return nil
			}
			return member.Admit(ctx)
		},
	})
	if err != nil {
		return err
	}
	builder.UseSandboxes(mgr) // sandbox snapshots are templates
	if err := met.WatchNode(mgr); err != nil {
		return err
	}
	if err := mgr.Start(ctx); err != nil {
		return err
	}
	defer func() {
		if err := mgr.Close(); err != nil {
			log.Warn("stopping the sandbox manager", "err", err)
		}
	}()
	// The node's record in the store (`warren nodes`), with the state an
	// operator set; closed (heartbeats stop) before the manager.
	diskMB, err := hostres.DiskMB(cfg.DataDir)
	if err != nil {
		return err
	}
	usage := func() store.NodeUsage {
		u := mgr.Usage()
		if free, err := freeMB(); err == nil {
			u.FreeDiskMB = int(free)
		}
		return u
	}
	skew, err := testClockOffset()
	if err != nil {
		return err
	}
	member, err = cluster.Join(ctx, cluster.Config{
		Store: st, Logger: log, Usage: usage, Drain: mgr.Drain,
		Now: func() time.Time { return time.Now().Add(skew) },
		Node: store.Node{Name: cfg.NodeName, Address: cfg.NodeAddr, Runtime: cfg.Runtime, CPUs: totals.CPUs, MemoryMB: totals.MemoryMB,
			MaxSandboxes: cfg.MaxSandboxes, DiskMB: int(diskMB), Labels: cfg.NodeLabels, IdentityKey: eg.identity.JWK().String()},
	})
	if err != nil {
		return err
	}
	defer member.Close()
	// After the manager's start, which removed the build sandboxes a
	// previous run left; closed before the manager.
	if err := builder.Start(ctx); err != nil {
		return err
	}
	defer builder.Close()
	// After the manager's start, whose image store cleanup removed what
	// an interrupted build left; stopped, and its overlay and directory
	// removed, before the server returns.
	if ciBuild != nil {
		buildCtx, stopBuild := context.WithCancel(ctx)
		ciBuild.Start(buildCtx)
		defer func() {
			stopBuild()
			ciBuild.Wait()
		}()
		log.Info("building a built-in template in the background: its creates get 503 until it is ready", "template", baseimage.CodeInterpreterID)
	}
	// The code interpreter's start snapshot, once its template is there
	// (built above, or by `warren setup`); stopped before the builder and
	// the manager close.
	snapCtx, stopSnap := context.WithCancel(ctx)
	snapDone := make(chan struct{})
	go func() {
		defer close(snapDone)
		if cfg.CodeInterpreterSnapshot {
			snapshotCodeInterpreter(snapCtx, images, builder, ciBuild, log)
		}
	}()
	defer func() {
		stopSnap()
		<-snapDone
	}()
	if live, _ := mgr.Count(); live > 0 {
		log.Info("sandboxes of the previous run are running on", "count", live)
	}
	go eg.sweep(ctx, st, log)

	proxyHandler := met.Proxy(proxy.New(proxy.Config{Domain: cfg.Domain, Resolver: mgr, Logger: log}))
	if cfg.Role == RoleNode {
		// The template routes the api processes forward here: builds
		// run, and templates live, on nodes.
		platform := api.New(api.Config{
			MaxTimeout: cfg.MaxSandboxTimeout,
			Store:      st, Sandboxes: mgr, Templates: builder, Secrets: secrets, ClientID: cfg.NodeName, Logger: log,
			NodeCPUs: totals.CPUs, NodeMemoryMB: totals.MemoryMB, RateLimit: cfg.APIRateLimit,
			DiskReserveMB: cfg.DiskReserveMB, FreeDiskMB: freeMB,
			TeamDiskQuotaMB: cfg.TeamDiskQuotaMB, VolumeQuotaMB: int64(cfg.VolumeQuotaMB),
		})
		internal := noderpc.Handler(noderpc.Served{Sandboxes: mgr, Teams: &noderpc.StoreTeams{Store: st},
			Traffic: proxyHandler, Platform: platform, Images: imagepeer.Handler(images)}, cl.auth.Guard(cfg.NodeName))
		srvs := []served{{proxy.NewHTTPServer(internal), nodeLn, false}}
		if ls.metrics != nil {
			srvs = append(srvs, served{met.NewHTTPServer(), ls.metrics, false})
		}
		log.Info("warren is serving (role node)", "node", cfg.NodeName, "node_addr", nodeLn.Addr().String(), "runtime", cfg.Runtime, "data_dir", cfg.DataDir)
		return serveUntil(ctx, log, srvs)
	}
	apiSrv := api.NewHTTPServer(api.New(api.Config{
		MaxTimeout: cfg.MaxSandboxTimeout,
		Store:      st, Sandboxes: mgr, Templates: builder, Secrets: secrets, Volumes: vols, Webhooks: webhooks, ClientID: cfg.NodeName, Logger: log,
		NodeCPUs: totals.CPUs, NodeMemoryMB: totals.MemoryMB, RateLimit: cfg.APIRateLimit,
		DiskReserveMB: cfg.DiskReserveMB, FreeDiskMB: freeMB, VolumeFreeDiskMB: volumeFreeMB(cfg),
		TeamDiskQuotaMB: cfg.TeamDiskQuotaMB, VolumeQuotaMB: int64(cfg.VolumeQuotaMB),
		JWKS: clusterJWKS(st), IdentityIssuer: issuer(cfg),
	}), api.Timeouts{})
	srvs, certs, err := publicServers(cfg, st, ls, apiSrv, proxyHandler)
	if err != nil {
		return err
	}
	metricsURL := ""
	if ls.metrics != nil {
		srvs = append(srvs, served{met.NewHTTPServer(), ls.metrics, false})
		metricsURL = "http://" + ls.metrics.Addr().String() + "/metrics"
	}
	log.Info("warren is serving", "api", "http://"+ls.api.Addr().String(), "proxy", "http://"+ls.proxy.Addr().String(),
		"proxy_tls", tlsAddrs(ls.tls), "metrics", metricsURL, "runtime", cfg.Runtime, "data_dir", cfg.DataDir)
	printExports(out, cfg, ls.api.Addr(), ls.proxy.Addr(), creds, ls.tls, certs)
	if ciBuild != nil {
		if state, _, _ := ciBuild.State(); state == setup.BuildBuilding {
			fmt.Fprintf(out, "\nThe %s template (@e2b/code-interpreter's default) is being built in the background (a few minutes on a fresh machine):\nits creates get 503 until the log says \"built-in template ready\"; base and other templates are served now.\n", baseimage.CodeInterpreterID)
		}
	}
	return serveUntil(ctx, log, srvs)
}

// openSecured makes the data dir private (before anything is written
// there) and opens the store, timed by met.
func openSecured(ctx context.Context, cfg Config, met *metrics.Metrics, log *slog.Logger) (store.Store, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	if changed, err := setup.SecureDataDir(cfg.DataDir); err != nil {
		return nil, err
	} else if changed != "" {
		log.Warn("data dir secured: other local users could reach tenants' files below it", "dir", cfg.DataDir, "changed", changed)
	}
	st, err := OpenStore(ctx, cfg.DataDir, cfg.StoreURL)
	if err != nil {
		return nil, err
	}
	return met.Store(st), nil
}

// publicServers are the API's and the proxy's servers on their
// listeners, the proxy's over TLS too when it has TLS listeners (with the
// certificates it serves).
//
// On each, the client's address is the TCP peer's, or, from a
// --trusted-proxy, what its PROXY header or X-Forwarded-For says
// (internal/clientaddr): the failed-authentication budgets are kept by it.
func publicServers(cfg Config, st store.Store, ls *listeners, apiSrv *http.Server, proxyHandler http.Handler) ([]served, *ingress.Certs, error) {
	trusted, err := clientaddr.New(cfg.TrustedProxies)
	if err != nil {
		return nil, nil, err
	}
	// The dashboard shares the API's address; its page reaches envd
	// through the proxy's handler, in process.
	apiHandler := apiSrv.Handler
	apiSrv.Handler = trusted.Handler(dashboard.New(dashboard.Config{API: apiHandler, Envd: proxyHandler, EnvdPort: envdinfo.Port, Store: st}))
	srvs := []served{{apiSrv, trusted.Listen(ls.api), false}}
	if ls.admin != nil {
		adminSrv, err := adminServer(cfg, st, apiSrv, apiHandler, proxyHandler)
		if err != nil {
			return nil, nil, err
		}
		srvs = append(srvs, served{adminSrv, ls.admin, false})
	}
	proxyHandler = trusted.Handler(proxyHandler)
	srvs = append(srvs, served{proxy.NewHTTPServer(proxyHandler), trusted.Listen(ls.proxy), false})
	if len(ls.tls) == 0 {
		return srvs, nil, nil
	}
	certs, err := ingress.New(ingress.Config{Domain: cfg.Domain, CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey, DataDir: cfg.DataDir})
	if err != nil {
		return nil, nil, err
	}
	tlsSrv := proxy.NewHTTPServer(proxyHandler)
	tlsSrv.TLSConfig = certs.TLSConfig()
	for _, ln := range ls.tls {
		srvs = append(srvs, served{tlsSrv, trusted.Listen(ln), true})
	}
	return srvs, certs, nil
}

// printExports prints the settings the E2B SDK needs to reach this
// server; the API key is the first start's, else read from the
// credentials file.
func printExports(out io.Writer, cfg Config, apiAddr, proxyAddr net.Addr, creds *auth.Credentials, tlsLns []net.Listener, certs *ingress.Certs) {
	key := fmt.Sprintf("$(sed -n 's/^E2B_API_KEY=//p' %s)", filepath.Join(cfg.DataDir, "credentials"))
	if creds != nil {
		key = creds.APIKey
	}
	// The volume content API is served by the API, where the SDK does
	// not look for it by itself (it would ask https://api.DOMAIN).
	fmt.Fprintf(out, "\nUse it from the E2B SDK (in another shell):\n  export E2B_API_URL=http://%s\n  export E2B_SANDBOX_URL=http://%s\n  export E2B_VOLUME_API_URL=http://%s\n  export E2B_DOMAIN=%s\n  export E2B_API_KEY=%s\n",
		apiAddr, proxyAddr, apiAddr, cfg.Domain, key)
	if certs != nil && certs.CAFile() != "" {
		// Node reads it once, at start: set it before the SDK's process starts.
		fmt.Fprintf(out, "  export NODE_EXTRA_CA_CERTS=%s\n", certs.CAFile())
	}
	if len(tlsLns) > 0 {
		fmt.Fprintf(out, "Sandbox hosts are served over HTTPS too (%s): https://{port}-{sandboxID}.%s, the SDK's URLs when E2B_SANDBOX_URL is unset",
			tlsAddrs(tlsLns), cfg.Domain)
		if _, port, _ := net.SplitHostPort(tlsLns[0].Addr().String()); port != "443" {
			fmt.Fprint(out, " (which the SDK expects on port 443)")
		}
		fmt.Fprintln(out, ".")
	}
	fmt.Fprintln(out)
}

// listenTLS listens on the TLS proxy's addresses; a certificate without
// any is a mistake worth saying.
func listenTLS(cfg Config) ([]net.Listener, error) {
	if len(cfg.ProxyTLSAddrs) == 0 {
		if cfg.TLSCert != "" || cfg.TLSKey != "" {
			return nil, errors.New("--tls-cert and --tls-key are for the TLS proxy: give --proxy-tls-addr too")
		}
		return nil, nil
	}
	var lns []net.Listener
	for _, addr := range cfg.ProxyTLSAddrs {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("--proxy-tls-addr: %w", err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// listenMetrics listens on --metrics-addr, if set: never the API's or
// the proxy's address, whose clients are tenants.
func listenMetrics(cfg Config) (net.Listener, error) {
	if cfg.MetricsAddr == "" {
		return nil, nil
	}
	for _, a := range append([]string{cfg.APIAddr, cfg.ProxyAddr}, cfg.ProxyTLSAddrs...) {
		if a == cfg.MetricsAddr {
			return nil, fmt.Errorf("--metrics-addr %s: metrics get a listener of their own, not the API's or the proxy's", cfg.MetricsAddr)
		}
	}
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	return ln, nil
}

func tlsAddrs(lns []net.Listener) string {
	var s []string
	for _, ln := range lns {
		s = append(s, ln.Addr().String())
	}
	return strings.Join(s, ",")
}

// volumeRoot is --volume-root (default DATA/volumes), absolute.
func volumeRoot(cfg Config) (string, error) {
	root := cfg.VolumeRoot
	if root == "" {
		root = filepath.Join(cfg.DataDir, "volumes")
	}
	return filepath.Abs(root)
}

// volumeFreeMB reads the free space of the volume root's file system
// (its parent's until it is made).
func volumeFreeMB(cfg Config) func() (int64, error) {
	return func() (int64, error) {
		root, err := volumeRoot(cfg)
		if err != nil {
			return 0, err
		}
		return hostres.FreeMB(root)
	}
}

// openVolumes opens the team volumes under --volume-root (default
// DATA/volumes).
func openVolumes(cfg Config, st store.Store, log *slog.Logger) (*volume.Manager, error) {
	root, err := volumeRoot(cfg)
	if err != nil {
		return nil, err
	}
	// A volume's image takes its whole size of the volume root's disk
	// when it is made: only if that leaves the reserve.
	reserve := func(needMB int64) error {
		free, err := hostres.FreeMB(root)
		if err != nil {
			return err
		}
		if free-needMB < cfg.DiskReserveMB {
			return fmt.Errorf("%w: the volume root's disk has %d MB free, too little for a volume of %d MB above the %d MB it keeps in reserve (--disk-reserve-mb)",
				volume.ErrNoSpace, free, needMB, cfg.DiskReserveMB)
		}
		return nil
	}
	return volume.Open(volume.Config{Root: root, QuotaMB: cfg.VolumeQuotaMB, MaxPerTeam: cfg.MaxVolumesPerTeam, Reserve: reserve, Store: st, Logger: log})
}

// openImages opens the image store, whose pulls stop at the disk reserve,
// and checks that `warren setup` made the base template.
func openImages(cfg Config) (*image.Store, error) {
	images, err := image.Open(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	// An image pull stops at the disk reserve as creates and builds do.
	images.GuardSpace(func() error {
		free, err := hostres.FreeMB(cfg.DataDir)
		if err != nil {
			return err
		}
		if free < cfg.DiskReserveMB {
			return fmt.Errorf("the data dir's file system has %d MB free, less than its reserve (--disk-reserve-mb %d): the image is too large for this node", free, cfg.DiskReserveMB)
		}
		return nil
	})
	if _, err := images.Template(baseimage.TemplateID); err != nil {
		return nil, fmt.Errorf("the base template is missing in %s: run `warren setup --data-dir %s` first (%v)", cfg.DataDir, cfg.DataDir, err)
	}
	return images, nil
}

// ensureMCPGateway builds the mcp-gateway template (the E2B SDK's for
// Sandbox.create({ mcp })) from the gateway binary beside envd, when it
// is missing or of another binary: a copy of one file, done at every
// start so that the template's gateway is this build's. Without the
// binary the template stays missing and its creates say so.
func ensureMCPGateway(ctx context.Context, images *image.Store, bin string, log *slog.Logger) {
	if _, err := os.Stat(bin); err != nil {
		log.Warn("no mcp-gateway binary beside envd: the mcp-gateway template is not served (build it with `make build`)", "path", bin)
		return
	}
	t, err := baseimage.EnsureMCPGateway(ctx, images, bin, nil)
	if err != nil {
		log.Error("building the mcp-gateway template", "err", err)
		return
	}
	log.Info("built-in template ready", "template", t.ID, "layers", t.Layers)
}

// findEnvd is the static envd binary: path, else envd beside this
// executable.
func findEnvd(path string) (string, error) {
	envd := path
	if envd == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", err
		}
		envd = filepath.Join(filepath.Dir(exe), "envd")
	}
	if _, err := os.Stat(envd); err != nil {
		return "", fmt.Errorf("envd: %w (build it with `make build`, or give --envd)", err)
	}
	return envd, nil
}

// newNode builds the node: the runtime, the resolvers sandboxes get, the
// network (closed by the caller) and the root filesystems over images.
func newNode(cfg Config, images *image.Store, envd string, eg *egressParts, log *slog.Logger) (*node.Node, *network.Manager, error) {
	rtCfg := runtime.Config{StateDir: filepath.Join(cfg.RunDir, cfg.Runtime), CgroupParent: cfg.CgroupParent}
	if cfg.Runtime == "runsc" {
		rtCfg.Binary = setup.RunscPath(cfg.DataDir)
	}
	rt, err := runtime.New(cfg.Runtime, rtCfg)
	if err != nil {
		return nil, nil, err
	}
	cidr, err := netip.ParsePrefix(cfg.NetworkCIDR)
	if err != nil {
		return nil, nil, fmt.Errorf("--network-cidr: %w", err)
	}
	dns, warnings, err := resolvconf.Load(cfg.ResolvConf)
	if err != nil {
		return nil, nil, fmt.Errorf("--resolv-conf: %w", err)
	}
	for _, w := range warnings {
		log.Warn("--resolv-conf: " + w)
	}
	resolvConf := filepath.Join(cfg.RunDir, "resolv.conf") // what sandboxes get
	if err := dns.WriteFile(resolvConf); err != nil {
		return nil, nil, err
	}
	if err := checkSandboxBounds(cfg); err != nil {
		return nil, nil, err
	}
	nw, err := network.New(network.Config{CIDR: cidr, Prefix: cfg.NetworkPrefix, AllowPrivate: cfg.AllowPrivate, Resolvers: dns.Nameservers,
		ProxyPort: eg.port, AuditGroup: auditGroup(cfg.NetworkPrefix),
		MaxConns: noBoundIfZero(cfg.SandboxMaxConns), ConnRate: noBoundIfZero(cfg.SandboxConnRate)})
	if err != nil {
		return nil, nil, err
	}
	if err := eg.start(nw, dns.Nameservers, auditGroup(cfg.NetworkPrefix), log); err != nil {
		nw.Close()
		return nil, nil, err
	}
	roots, err := rootfs.Open(cfg.DataDir)
	if err != nil {
		nw.Close()
		return nil, nil, err
	}
	n, err := node.New(node.Config{Runtime: rt, Network: nw, Rootfs: node.LocalRootfs(roots, images), EnvdPath: envd, ResolvConf: resolvConf,
		EgressProxy: eg.proxy, TrustCA: eg.ca.CertPEM(), DiskIO: diskIO(cfg)})
	if err != nil {
		nw.Close()
		return nil, nil, err
	}
	return n, nw, nil
}

// Default per-sandbox disk IO bounds: far below what one NVMe disk
// does, so that a few sandboxes reading or syncing flat out leave the
// node's disk usable for the others, and far above what a build step or
// a test suite needs.
const (
	DefaultSandboxDiskReadMBps  = 256
	DefaultSandboxDiskWriteMBps = 128
	DefaultSandboxDiskIOPS      = 4000
)

// checkSandboxBounds refuses negative per-sandbox bounds (0 is "none").
func checkSandboxBounds(cfg Config) error {
	for flag, v := range map[string]int{
		"--sandbox-max-conns": cfg.SandboxMaxConns, "--sandbox-conn-rate": cfg.SandboxConnRate,
		"--sandbox-disk-read-mbps": cfg.SandboxDiskReadMBps, "--sandbox-disk-write-mbps": cfg.SandboxDiskWriteMBps,
		"--sandbox-disk-iops": cfg.SandboxDiskIOPS,
	} {
		if v < 0 {
			return fmt.Errorf("%s %d: want 0 (no bound) or more", flag, v)
		}
	}
	return nil
}

// diskIO is the flags' per-sandbox disk IO bounds.
func diskIO(cfg Config) runtime.DiskIO {
	return runtime.DiskIO{
		ReadBytesPerSec: uint64(cfg.SandboxDiskReadMBps) << 20, WriteBytesPerSec: uint64(cfg.SandboxDiskWriteMBps) << 20,
		ReadIOPS: uint64(cfg.SandboxDiskIOPS), WriteIOPS: uint64(cfg.SandboxDiskIOPS),
	}
}

// noBoundIfZero turns a flag's 0 ("no bound") into network.Config's -1
// (whose 0 means the default).
func noBoundIfZero(v int) int {
	if v == 0 {
		return -1
	}
	return v
}

// checkRuntime refuses runc unless insecure is set: a runc sandbox is a
// container on the host kernel, hardened (seccomp, capabilities, masked
// /proc) but one kernel bug away from the host, and Warren runs hostile
// code. gVisor puts its own kernel in between.
func checkRuntime(name string, insecure bool) error {
	if name == "runc" && !insecure {
		return errors.New("--runtime runc runs sandboxes on the host kernel, where one kernel exploit by sandboxed code reaches the host: " +
			"use --runtime runsc (gVisor, the default), or add --insecure-runtime if every sandbox on this node runs trusted code")
	}
	return nil
}

// OpenStore opens the store warren serve uses: url (PostgreSQL, or a
// SQLite file), else SQLite in the data directory.
func OpenStore(ctx context.Context, dataDir, url string) (store.Store, error) {
	if url == "" {
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return nil, err
		}
		url = filepath.Join(dataDir, "warren.db")
	}
	return store.Open(ctx, url)
}
