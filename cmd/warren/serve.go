package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
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
	"github.com/warren-sandbox/warren/internal/hostres"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/resolvconf"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/template"
)

type serveFlags struct {
	dataDir, storeURL, apiAddr, proxyAddr, domain string
	runtime, envd, runDir, cgroupParent           string
	networkCIDR, networkPrefix, nodeName          string
	registryMirror                                string
	resolvConf                                    string
	allowPrivate                                  network.PrefixList
	maxSandboxes, maxPerTeam, poolSize, builds    int
	memoryOvercommit, cpuOvercommit, apiRateLimit float64
	diskReserveMB                                 int64
	pausedRetention                               time.Duration
	maxUploadMB                                   int
	insecureRegistries                            registryList
	insecureRuntime                               bool
	buildDiskMB                                   int
}

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

func runServe(ctx context.Context, args []string) error {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	fs.StringVar(&f.dataDir, "data-dir", setup.DefaultDataDir, "where Warren keeps its state (run `warren setup` on it first)")
	fs.StringVar(&f.storeURL, "store", "", "PostgreSQL URL, or a SQLite file (default: DATA-DIR/warren.db)")
	fs.StringVar(&f.apiAddr, "api-addr", "127.0.0.1:3000", "address of the platform API (E2B_API_URL)")
	fs.StringVar(&f.proxyAddr, "proxy-addr", "127.0.0.1:3002", "address of the sandbox proxy (E2B_SANDBOX_URL)")
	fs.StringVar(&f.domain, "domain", "localhost", "sandbox hosts are {port}-{sandboxID}.DOMAIN")
	fs.StringVar(&f.runtime, "runtime", "runsc", "sandbox runtime: runsc (gVisor) or runc (needs --insecure-runtime)")
	fs.BoolVar(&f.insecureRuntime, "insecure-runtime", false, "allow --runtime runc, whose sandboxes share the host kernel with the code they run (trusted code only)")
	fs.StringVar(&f.envd, "envd", "", "the static envd binary (default: envd beside this executable)")
	fs.StringVar(&f.runDir, "run-dir", "/run/warren", "runtime state (tmpfs)")
	fs.StringVar(&f.cgroupParent, "cgroup-parent", "/warren", "cgroup under which sandboxes get theirs")
	fs.StringVar(&f.networkCIDR, "network-cidr", network.DefaultCIDR.String(), "IPv4 range sandbox addresses come from")
	fs.StringVar(&f.networkPrefix, "network-prefix", network.DefaultPrefix, "name prefix of network namespaces, veths and nftables tables")
	fs.StringVar(&f.nodeName, "node-name", "local", "this node's name in sandbox records")
	fs.IntVar(&f.maxSandboxes, "max-sandboxes", 100, "most sandboxes on this node, warm ones included (over: 503)")
	fs.IntVar(&f.maxPerTeam, "max-sandboxes-per-team", 0, "most sandboxes of one team (over: 429); 0: no limit")
	fs.IntVar(&f.poolSize, "pool-size", 2, "warm sandboxes kept ready for the base template; 0: none")
	fs.StringVar(&f.registryMirror, "registry-mirror", "", "registry asked instead of Docker Hub for docker.io images in template builds (host:port, or http://host:port)")
	fs.IntVar(&f.builds, "build-concurrency", 2, "template builds that run at once; more wait")
	fs.Float64Var(&f.memoryOvercommit, "memory-overcommit", sandbox.DefaultMemoryOvercommit, "sandboxes' memory (live, starting and warm) may add up to the node's memory times this (over: 503)")
	fs.Float64Var(&f.cpuOvercommit, "cpu-overcommit", sandbox.DefaultCPUOvercommit, "sandboxes' CPUs may add up to the node's CPUs times this (over: 503)")
	fs.Int64Var(&f.diskReserveMB, "disk-reserve-mb", 2048, "free MB the data dir's file system keeps: below it, sandbox creates, template builds and uploads get 507")
	fs.DurationVar(&f.pausedRetention, "paused-retention", sandbox.DefaultPausedRetention, "paused sandboxes are removed this long after they were paused")
	fs.Float64Var(&f.apiRateLimit, "api-rate-limit", 50, "API requests per second per team, burst twice that (over: 429); 0: no limit")
	fs.Var(&f.allowPrivate, "allow-private-cidr", "a private, CGNAT or link-local `CIDR` range that sandboxes may reach despite the default deny (repeatable, or comma-separated)")
	fs.StringVar(&f.resolvConf, "resolv-conf", "/etc/resolv.conf", "resolv.conf `FILE` naming the resolvers sandboxes use and may reach on port 53 (naming only the systemd-resolved stub: its upstream servers)")
	fs.IntVar(&f.maxUploadMB, "max-upload-mb", 1024, "largest template file upload, in MiB (over: 413)")
	fs.Var(&f.insecureRegistries, "allow-insecure-registry", "HOST[:PORT] of a registry template builds may pull from over plain HTTP or at a loopback, private or link-local address (repeatable; the --registry-mirror is allowed too)")
	fs.IntVar(&f.buildDiskMB, "build-disk-mb", template.DefaultBuildDiskMB, "disk of each build sandbox's writable layer, in MB (what one template build step may write)")
	fs.Parse(args)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	return serve(ctx, f, log)
}

func serve(ctx context.Context, f serveFlags, log *slog.Logger) error {
	if err := checkRuntime(f.runtime, f.insecureRuntime); err != nil {
		return err
	}
	// Listen first: a taken port should fail before anything is started.
	apiLn, err := net.Listen("tcp", f.apiAddr)
	if err != nil {
		return err
	}
	defer apiLn.Close()
	proxyLn, err := net.Listen("tcp", f.proxyAddr)
	if err != nil {
		return err
	}
	defer proxyLn.Close()

	// Before anything is written there.
	if changed, err := setup.SecureDataDir(f.dataDir); err != nil {
		return err
	} else if changed != "" {
		log.Warn("data dir secured: other local users could reach tenants' files below it", "dir", f.dataDir, "changed", changed)
	}
	st, err := openStore(ctx, f.dataDir, f.storeURL)
	if err != nil {
		return err
	}
	defer st.Close()
	creds, err := auth.Bootstrap(ctx, st, f.dataDir, os.Getenv("WARREN_API_KEY"), os.Getenv("WARREN_ACCESS_TOKEN"))
	if err != nil {
		return err
	}
	if creds != nil {
		fmt.Printf("First start: created an API key and an access token. They are shown only now, and kept in %s (mode 0600).\n", creds.File)
		fmt.Printf("  API key:      %s\n  access token: %s\n", creds.APIKey, creds.AccessToken)
	}

	images, err := image.Open(f.dataDir)
	if err != nil {
		return err
	}
	// An image pull stops at the disk reserve as creates and builds do.
	images.GuardSpace(func() error {
		free, err := hostres.FreeMB(f.dataDir)
		if err != nil {
			return err
		}
		if free < f.diskReserveMB {
			return fmt.Errorf("the data dir's file system has %d MB free, less than its reserve (--disk-reserve-mb %d): the image is too large for this node", free, f.diskReserveMB)
		}
		return nil
	})
	if _, err := images.Template(baseimage.TemplateID); err != nil {
		return fmt.Errorf("the base template is missing in %s: run `warren setup --data-dir %s` first (%v)", f.dataDir, f.dataDir, err)
	}
	envd := f.envd
	if envd == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		envd = filepath.Join(filepath.Dir(exe), "envd")
	}
	if _, err := os.Stat(envd); err != nil {
		return fmt.Errorf("envd: %w (build it with `make build`, or give --envd)", err)
	}
	rtCfg := runtime.Config{StateDir: filepath.Join(f.runDir, f.runtime), CgroupParent: f.cgroupParent}
	if f.runtime == "runsc" {
		rtCfg.Binary = setup.RunscPath(f.dataDir)
	}
	rt, err := runtime.New(f.runtime, rtCfg)
	if err != nil {
		return err
	}
	cidr, err := netip.ParsePrefix(f.networkCIDR)
	if err != nil {
		return fmt.Errorf("--network-cidr: %w", err)
	}
	dns, warnings, err := resolvconf.Load(f.resolvConf)
	if err != nil {
		return fmt.Errorf("--resolv-conf: %w", err)
	}
	for _, w := range warnings {
		log.Warn("--resolv-conf: " + w)
	}
	resolvConf := filepath.Join(f.runDir, "resolv.conf") // what sandboxes get
	if err := dns.WriteFile(resolvConf); err != nil {
		return err
	}
	nw, err := network.New(network.Config{CIDR: cidr, Prefix: f.networkPrefix, AllowPrivate: f.allowPrivate, Resolvers: dns.Nameservers})
	if err != nil {
		return err
	}
	defer nw.Close()
	roots, err := rootfs.Open(f.dataDir)
	if err != nil {
		return err
	}
	n, err := node.New(node.Config{Runtime: rt, Network: nw, Rootfs: node.LocalRootfs(roots, images), EnvdPath: envd, ResolvConf: resolvConf})
	if err != nil {
		return err
	}
	if f.maxUploadMB <= 0 {
		return fmt.Errorf("--max-upload-mb must be positive")
	}
	builder, err := template.New(template.Config{
		Store: st, Images: images, Node: n, NodeName: f.nodeName, Concurrency: f.builds,
		RegistryMirror: f.registryMirror, InsecureRegistries: f.insecureRegistries,
		MaxUploadBytes: int64(f.maxUploadMB) << 20, BuildDiskMB: f.buildDiskMB, Logger: log,
	})
	if err != nil {
		return err
	}
	totals, err := hostres.Read()
	if err != nil {
		return err
	}
	mgr, err := sandbox.New(sandbox.Config{
		Store: st, Node: n, Images: images, NodeName: f.nodeName,
		MaxSandboxes: f.maxSandboxes, MaxPerTeam: f.maxPerTeam, PoolSize: f.poolSize, Logger: log,
		Resolve:  builder.SandboxTemplate,
		NodeCPUs: totals.CPUs, NodeMemoryMB: totals.MemoryMB,
		CPUOvercommit: f.cpuOvercommit, MemoryOvercommit: f.memoryOvercommit, PausedRetention: f.pausedRetention,
	})
	if err != nil {
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
	// After the manager's start, which removed the build sandboxes a
	// previous run left; closed before the manager.
	if err := builder.Start(ctx); err != nil {
		return err
	}
	defer builder.Close()
	if live, _ := mgr.Count(); live > 0 {
		log.Info("sandboxes of the previous run are running on", "count", live)
	}

	dataDir := f.dataDir
	apiSrv := api.NewHTTPServer(api.New(api.Config{
		Store: st, Sandboxes: mgr, Templates: builder, ClientID: f.nodeName, Logger: log,
		NodeCPUs: totals.CPUs, NodeMemoryMB: totals.MemoryMB, RateLimit: f.apiRateLimit,
		DiskReserveMB: f.diskReserveMB, FreeDiskMB: func() (int64, error) { return hostres.FreeMB(dataDir) },
	}), api.Timeouts{})
	proxySrv := proxy.NewHTTPServer(proxy.New(proxy.Config{Domain: f.domain, Resolver: mgr, Logger: log}))
	errc := make(chan error, 2)
	go func() { errc <- apiSrv.Serve(apiLn) }()
	go func() { errc <- proxySrv.Serve(proxyLn) }()
	log.Info("warren is serving", "api", "http://"+apiLn.Addr().String(), "proxy", "http://"+proxyLn.Addr().String(),
		"runtime", f.runtime, "data_dir", f.dataDir)
	key := fmt.Sprintf("$(sed -n 's/^E2B_API_KEY=//p' %s)", filepath.Join(f.dataDir, "credentials"))
	if creds != nil {
		key = creds.APIKey
	}
	fmt.Printf("\nUse it from the E2B SDK (in another shell):\n  export E2B_API_URL=http://%s\n  export E2B_SANDBOX_URL=http://%s\n  export E2B_DOMAIN=%s\n  export E2B_API_KEY=%s\n\n",
		apiLn.Addr(), proxyLn.Addr(), f.domain, key)
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	log.Info("shutting down; running sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = apiSrv.Shutdown(sctx)
	// Sandbox streams (a command's output) may be open for hours: don't wait.
	_ = proxySrv.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
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
