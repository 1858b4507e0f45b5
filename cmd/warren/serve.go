package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/server"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
	"github.com/warren-sandbox/warren/internal/volume"
	"github.com/warren-sandbox/warren/internal/webhook"
)

// registryList is --allow-insecure-registry: repeatable, each HOST[:PORT].
type registryList []string

func (l *registryList) String() string { return strings.Join(*l, ",") }

func (l *registryList) Set(v string) error {
	if _, _, err := oci.ParseRegistryHost(v); err != nil {
		return err
	}
	*l = append(*l, v)
	return nil
}

// labelList is --node-label: repeatable, each KEY=VALUE or a
// comma-separated list of them.
type labelList map[string]string

func (l *labelList) String() string { return "" }

func (l *labelList) Set(v string) error {
	if *l == nil {
		*l = map[string]string{}
	}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok || !store.ValidLabel(k, val) {
			return fmt.Errorf("%q: want KEY=VALUE, each 1 to 63 letters, digits or . _ / -", kv)
		}
		(*l)[k] = val
	}
	return nil
}

// addrList is --proxy-tls-addr: repeatable, each comma-separated.
type addrList []string

func (l *addrList) String() string { return strings.Join(*l, ",") }

func (l *addrList) Set(v string) error {
	for _, a := range strings.Split(v, ",") {
		if a = strings.TrimSpace(a); a != "" {
			*l = append(*l, a)
		}
	}
	return nil
}

func runServe(ctx context.Context, args []string) error {
	var f server.Config
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	fs.StringVar(&f.DataDir, "data-dir", setup.DefaultDataDir, "where Warren keeps its state (run `warren setup` on it first)")
	fs.StringVar(&f.StoreURL, "store", "", "PostgreSQL URL, or a SQLite file (default: DATA-DIR/warren.db)")
	fs.StringVar(&f.APIAddr, "api-addr", "127.0.0.1:3000", "address of the platform API (E2B_API_URL)")
	fs.StringVar(&f.ProxyAddr, "proxy-addr", "127.0.0.1:3002", "address of the sandbox proxy (E2B_SANDBOX_URL)")
	fs.StringVar(&f.Domain, "domain", "localhost", "sandbox hosts are {port}-{sandboxID}.DOMAIN")
	fs.Var((*addrList)(&f.ProxyTLSAddrs), "proxy-tls-addr", "`ADDR` where the sandbox proxy also serves HTTPS, e.g. 127.0.0.1:443 (repeatable, or comma-separated; default: no HTTPS)")
	fs.StringVar(&f.TLSCert, "tls-cert", "", "certificate chain (PEM) of the HTTPS proxy, a wildcard for *.DOMAIN (default: one Warren's local CA in DATA-DIR/ingress signs)")
	fs.StringVar(&f.TLSKey, "tls-key", "", "the --tls-cert's private key (PEM)")
	fs.Var(&f.TrustedProxies, "trusted-proxy", "`CIDR` (or address) of a load balancer in front of the API and proxy listeners: from it only, the client's address is taken from the PROXY protocol (v1/v2) or X-Forwarded-For (the rightmost hop not in a trusted range); from anyone else those are ignored and removed (repeatable, or comma-separated; default: none)")
	fs.StringVar(&f.Runtime, "runtime", "runsc", "sandbox runtime: runsc (gVisor) or runc (needs --insecure-runtime)")
	fs.BoolVar(&f.InsecureRuntime, "insecure-runtime", false, "allow --runtime runc, whose sandboxes share the host kernel with the code they run (trusted code only)")
	fs.StringVar(&f.Envd, "envd", "", "the static envd binary (default: envd beside this executable)")
	// Left empty, the host settings are derived from the data dir (see
	// internal/server's claims): another data dir never shares them.
	fs.StringVar(&f.RunDir, "run-dir", "", "runtime state (tmpfs) (default: /run/warren for /var/lib/warren, else /run/warren-HASH of the data dir)")
	fs.StringVar(&f.CgroupParent, "cgroup-parent", "", "cgroup under which sandboxes get theirs (default: /warren for /var/lib/warren, else /warren-HASH)")
	fs.StringVar(&f.NetworkCIDR, "network-cidr", "", "IPv4 range sandbox addresses come from (default: "+network.DefaultCIDR.String()+" for /var/lib/warren, else a /16 of 10.12-10.111 from the data dir's HASH)")
	fs.StringVar(&f.NetworkPrefix, "network-prefix", "", "name prefix of network namespaces, veths and nftables tables (default: "+network.DefaultPrefix+" for /var/lib/warren, else xHASH)")
	fs.StringVar(&f.NodeName, "node-name", "local", "this node's name in sandbox records")
	fs.StringVar(&f.Role, "role", server.RoleAll, "what this process does: all (one box: API, proxy and sandboxes), api (API and proxy of a cluster, sandboxes on its nodes) or node (a cluster's sandboxes and builds, served to the api processes at --node-addr)")
	fs.StringVar(&f.NodeAddr, "node-addr", "", "`HOST:PORT` where a --role node process serves the api processes (the internal RPC and forwarded sandbox traffic); they must reach it")
	fs.StringVar(&f.ClusterSecretFile, "cluster-secret-file", "", "`FILE` holding the cluster secret that authenticates the processes of a cluster to each other (default: $WARREN_CLUSTER_SECRET)")
	fs.Var((*labelList)(&f.NodeLabels), "node-label", "`KEY=VALUE` labelling this node in `warren nodes` (repeatable, or comma-separated; letters, digits and . _ / -)")
	fs.DurationVar(&f.PlacementTimeout, "placement-timeout", 0, "the api role answers a create not placed on a node within this long 504 sandbox_placement_timeout (a node that hangs), and abandons it; 0: no bound")
	fs.DurationVar(&f.LostAfter, "lost-after", cluster.DefaultLostAfter, "a node not heard from for this long is lost: the api role places nothing there and reports its sandboxes gone")
	fs.IntVar(&f.MaxSandboxes, "max-sandboxes", 100, "most sandboxes on this node, warm ones included (over: 503)")
	fs.IntVar(&f.MaxPerTeam, "max-sandboxes-per-team", 0, "most sandboxes of one team (over: 429); 0: no limit. In a cluster the api processes hold it across nodes; give nodes the same value (they claim it for resumes on traffic)")
	fs.IntVar(&f.PoolSize, "pool-size", 2, "warm sandboxes always kept ready for the base template, the floor of its adaptive pool; 0: no warm pools at all")
	fs.IntVar(&f.PoolMaxMemoryMB, "pool-max-memory-mb", 0, "memory the warm pools' idle sandboxes may hold above their floors, each counted at what a started one was measured to hold; the pools grow with the create rate and batches (default: a quarter of the node's memory)")
	fs.StringVar(&f.RegistryMirror, "registry-mirror", "", "registry asked instead of Docker Hub for docker.io images in template builds (host:port, or http://host:port)")
	fs.IntVar(&f.BuildConcurrency, "build-concurrency", 2, "template builds that run at once; more wait")
	fs.BoolVar(&f.CodeInterpreterSnapshot, "code-interpreter-snapshot", true, "once code-interpreter-v1 exists, take its start snapshot (a sandbox with the default Python kernel running, checkpointed) so that its sandboxes are restored with a running kernel instead of booted; false: they boot, and the first cell waits for Python")
	fs.BoolVar(&f.BuildCodeInterpreter, "build-code-interpreter", false, "build the code-interpreter-v1 template (@e2b/code-interpreter's default) in the background while serving, if it is missing or of an old recipe (make run does; warren setup builds it before instead): until it is ready its creates get 503 saying so, and a failed build is logged and retried at the next start")
	fs.Float64Var(&f.MemoryOvercommit, "memory-overcommit", sandbox.DefaultMemoryOvercommit, "sandboxes' memory (live, starting and warm) may add up to the node's memory times this (over: 503)")
	fs.Float64Var(&f.CPUOvercommit, "cpu-overcommit", sandbox.DefaultCPUOvercommit, "sandboxes' CPUs may add up to the node's CPUs times this (over: 503)")
	fs.Int64Var(&f.DiskReserveMB, "disk-reserve-mb", 2048, "free MB the data dir's file system keeps: below it, sandbox creates, template builds and uploads get 507")
	fs.Int64Var(&f.TeamDiskQuotaMB, "team-disk-quota-mb", 51200, "MB of the nodes' disks one team's volumes (their whole quota), paused sandboxes, templates and snapshots may take: at or over it, volume creates, pauses, snapshots and template builds get 507 (soft: what is being made may overshoot until the next request); 0: no quota")
	fs.DurationVar(&f.MaxSandboxTimeout, "max-sandbox-timeout", sandbox.MaxTimeout, "longest timeout a sandbox may be given (create, connect, resume, fork, set timeout); longer asks are a 400. Give an api and its nodes the same")
	fs.StringVar(&f.BlobStore.URL, "blob-store", "", "keep paused sandboxes (disk and memory checkpoint) and built templates' images in `STORE` too, so that any node sharing it resumes or starts them: s3://BUCKET[/PREFIX] (S3-compatible object storage) or an absolute directory; a pause answers, and a build is ready, once its blobs are stored (default: none, they stay on their node)")
	fs.StringVar(&f.BlobStore.Endpoint, "blob-store-endpoint", "", "`ENDPOINT` of the S3-compatible service of --blob-store (MinIO, SeaweedFS, Ceph...): [http(s)://]HOST[:PORT], http:// for plain HTTP (default: AWS S3)")
	fs.StringVar(&f.BlobStore.Region, "blob-store-region", "", "region of --blob-store's bucket (default: the service's)")
	fs.BoolVar(&f.BlobStore.PathStyle, "blob-store-path-style", false, "address --blob-store's bucket in the URL path rather than the host name (MinIO, SeaweedFS, Ceph)")
	fs.StringVar(&f.BlobStore.AccessKey, "blob-store-access-key", "", "access key ID for --blob-store, with --blob-store-secret-key-file (default: $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY, else the shared credentials file)")
	fs.StringVar(&f.BlobStore.SecretKeyFile, "blob-store-secret-key-file", "", "`FILE` holding the secret key of --blob-store-access-key")
	fs.IntVar(&f.BlobCacheMB, "blob-cache-mb", 0, "most MiB of paused sandboxes' files this node keeps beside --blob-store: the least recently paused go first and are fetched back at their resume (running sandboxes are never touched); 0: no bound")
	fs.StringVar(&f.BlobStore.CredentialsFile, "blob-store-credentials-file", "", "AWS shared credentials `FILE` for --blob-store (default: $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials; profile $AWS_PROFILE)")
	fs.DurationVar(&f.PausedRetention, "paused-retention", sandbox.DefaultPausedRetention, "paused sandboxes are removed, with their checkpoints, this long after they were paused")
	fs.Float64Var(&f.APIRateLimit, "api-rate-limit", 50, "API requests per second per team, burst twice that (over: 429); 0: no limit")
	fs.Var(&f.WebhookAllow, "webhook-allow-cidr", "a loopback, private or link-local `CIDR` range webhook URLs may reach (refused by default, as are cloud metadata addresses; repeatable, or comma-separated)")
	fs.DurationVar(&f.WebhookTimeout, "webhook-timeout", webhook.DefaultAttemptTimeout, "bound of each webhook delivery attempt (connect, send, answer); an endpoint that takes longer fails the attempt")
	fs.DurationVar(&f.WebhookRetryInterval, "webhook-retry-interval", webhook.DefaultRetryInterval, "wait before each of a failed webhook delivery's 3 retries")
	fs.IntVar(&f.MaxWebhooksPerTeam, "max-webhooks-per-team", webhook.DefaultMaxPerTeam, "most webhooks of one team (over: 429)")
	fs.DurationVar(&f.EventRetention, "event-retention", webhook.DefaultRetention, "sandbox lifecycle events (GET /events/sandboxes) and webhook delivery records are kept this long")
	fs.Var(&f.AllowPrivate, "allow-private-cidr", "a private, CGNAT or link-local `CIDR` range that sandboxes may reach despite the default deny (repeatable, or comma-separated)")
	fs.StringVar(&f.ResolvConf, "resolv-conf", "/etc/resolv.conf", "resolv.conf `FILE` naming the resolvers sandboxes use and may reach on port 53 (naming only the systemd-resolved stub: its upstream servers)")
	fs.IntVar(&f.MaxUploadMB, "max-upload-mb", 1024, "largest template file upload, in MiB (over: 413)")
	fs.Var((*registryList)(&f.InsecureRegistries), "allow-insecure-registry", "HOST[:PORT] of a registry template builds may pull from over plain HTTP or at a loopback, private or link-local address (repeatable; the --registry-mirror is allowed too)")
	fs.IntVar(&f.BuildDiskMB, "build-disk-mb", template.DefaultBuildDiskMB, "disk of each build sandbox's writable layer, in MB (what one template build step may write)")
	fs.IntVar(&f.EgressProxyPort, "egress-proxy-port", 0, "host port of the egress proxy that enforces domain rules (only sandboxes' redirected connections reach it); 0: a free one")
	fs.StringVar(&f.EgressCAFile, "egress-ca-file", "", "PEM `FILE` of root certificates the egress proxy trusts, beside the system's, when it re-encrypts to a host that has rules")
	fs.StringVar(&f.IdentityTrustDomain, "identity-trust-domain", "", "SPIFFE trust domain of sandboxes' workload identity tokens (spiffe://TD/team/T/sandbox/ID; every process of a cluster takes the same); default: --domain, or \"warren\" when that is no trust domain name")
	fs.StringVar(&f.IdentityIssuer, "identity-issuer", "", "`URL` of the API put in workload identity tokens' iss; set, the API also serves /.well-known/openid-configuration (OIDC federation); default: no iss")
	fs.StringVar(&f.VolumeRoot, "volume-root", "", "`DIR` holding team volumes (default DATA-DIR/volumes); several nodes may share one over NFS, with --volume-quota 0")
	fs.IntVar(&f.VolumeQuotaMB, "volume-quota", volume.DefaultQuotaMB, "size in MB of each new volume's own file system (writes past it fail with ENOSPC); 0: plain directories without a limit")
	fs.IntVar(&f.MaxVolumesPerTeam, "max-volumes-per-team", volume.DefaultMaxPerTeam, "most volumes of one team (over: 429); 0: no limit")
	fs.IntVar(&f.SandboxMaxConns, "sandbox-max-conns", network.DefaultMaxConns, "most connections (conntrack entries: TCP, UDP flows, ...) each sandbox may have open at once; over it, new TCP is reset and anything else dropped; 0: no bound")
	fs.IntVar(&f.SandboxConnRate, "sandbox-conn-rate", network.DefaultConnRate, "most new connections each sandbox may open per second, bursts of twice that; over it, the first packet is dropped (TCP retries it); 0: no bound")
	fs.IntVar(&f.SandboxDiskReadMBps, "sandbox-disk-read-mbps", server.DefaultSandboxDiskReadMBps, "MiB per second each sandbox may read from the block device of its disk; 0: no bound")
	fs.IntVar(&f.SandboxDiskWriteMBps, "sandbox-disk-write-mbps", server.DefaultSandboxDiskWriteMBps, "MiB per second each sandbox may write to the block device of its disk, where the kernel charges the writes to it (on cgroup v1 not the buffered writes the kernel writes back later: see docs/security.md); 0: no bound")
	fs.IntVar(&f.SandboxDiskIOPS, "sandbox-disk-iops", server.DefaultSandboxDiskIOPS, "read and write operations per second (each) a sandbox may start on the block device of its disk; 0: no bound")
	var level slog.Level
	fs.TextVar(&level, "log-level", slog.LevelInfo, "least severe log level written: debug, info, warn or error (debug adds each create's step durations)")
	fs.StringVar(&f.MetricsAddr, "metrics-addr", "", "`HOST:PORT` where Prometheus metrics are served at /metrics, on a listener of their own (default: not served)")
	fs.StringVar(&f.AdminAddr, "admin-addr", "", "`HOST:PORT` where the dashboard is served with its nodes page (state, capacity, cordon, uncordon, drain), signed in with the admin token in DATA-DIR/admin-token (made on first use), on a listener of its own: bind it to loopback or an operators' network (default: not served)")
	logFormat := fs.String("log-format", server.LogFormats[0], "log line format: json (one object a line, for log collectors) or text (key=value, for people); a line about a request names its request_id")
	fs.Parse(args)
	log, err := server.NewLogger(os.Stderr, *logFormat, level)
	if err != nil {
		return err
	}
	// Libraries' lines (slog's default, the log package's) in the same
	// format, so that every line of the log parses.
	slog.SetDefault(log)
	return server.Run(ctx, f, log)
}
