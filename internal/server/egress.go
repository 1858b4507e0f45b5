package server

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/identity"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/store"
)

// egressParts is the node's egress enforcement: the proxy's listener,
// CA and audit log are made before the network (which needs the port),
// the proxy itself after it (it needs Refused).
type egressParts struct {
	ln      net.Listener
	port    uint16
	ca      *egress.CA
	roots   *x509.CertPool
	audit   *egress.Audit
	secrets *secret.Service
	proxy   *egress.Proxy
	kernel  *egress.KernelAudit
	nw      *network.Manager
	dns     []netip.Addr
	// identity mints sandboxes' workload identity tokens.
	identity *identity.Signer
}

// Audit retention: files of sandboxes that are gone are kept this long,
// and all of them together at most this large.
const (
	auditMaxAge   = 30 * 24 * time.Hour
	auditMaxTotal = 256 << 20
	auditSweep    = time.Hour
)

func openEgress(cfg Config, secrets *secret.Service, log *slog.Logger) (*egressParts, error) {
	dir := filepath.Join(cfg.DataDir, "egress")
	ca, err := egress.LoadCA(dir)
	if err != nil {
		return nil, err
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if cfg.EgressCAFile != "" {
		pem, err := os.ReadFile(cfg.EgressCAFile)
		if err != nil {
			return nil, fmt.Errorf("--egress-ca-file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--egress-ca-file %s: no PEM certificate in it", cfg.EgressCAFile)
		}
	}
	audit, err := egress.OpenAudit(filepath.Join(dir, "audit"), 0, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(cfg.EgressProxyPort)))
	if err != nil {
		audit.Close()
		return nil, fmt.Errorf("the egress proxy's port (--egress-proxy-port): %w", err)
	}
	return &egressParts{ln: ln, port: uint16(ln.Addr().(*net.TCPAddr).Port), ca: ca, roots: roots, audit: audit, secrets: secrets}, nil
}

// start makes the proxy, now that the network knows what it refuses, and
// starts serving and reading the kernel's audit.
func (e *egressParts) start(nw *network.Manager, resolvers []netip.Addr, group uint16, log *slog.Logger) error {
	e.nw, e.dns = nw, resolvers
	p, err := egress.NewProxy(egress.ProxyConfig{
		Refused: nw.Refused, Resolver: resolverFor(resolvers), CA: e.ca, RootCAs: e.roots,
		Secrets: e.secrets.Resolve, Identity: e.identity.Mint, Audit: e.audit, Logger: log,
	})
	if err != nil {
		return err
	}
	e.proxy = p
	go func() {
		if err := p.Serve(e.ln); err != nil {
			log.Error("the egress proxy stopped", "err", err)
		}
	}()
	if e.kernel, err = p.StartKernelAudit(group); err != nil {
		log.Warn("egress decisions made in the kernel (address rules) are not audited", "err", err)
	}
	log.Info("egress proxy listening", "port", e.port)
	return nil
}

func (e *egressParts) close() {
	if e.kernel != nil {
		e.kernel.Close()
	}
	if e.proxy != nil {
		e.proxy.Close()
	}
	e.ln.Close()
	e.audit.Close()
}

// checkUpstream refuses an egressProxy address the node would never dial:
// one that does not resolve, or only to addresses sandboxes may not reach.
func (e *egressParts) checkUpstream(ctx context.Context, address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if addrs, err = resolverFor(e.dns).LookupNetIP(ctx, "ip4", host); err != nil {
			return fmt.Errorf("it does not resolve: %v", err)
		}
	}
	for _, a := range addrs {
		if !e.nw.Refused(a) {
			return nil
		}
	}
	return errors.New("it is an address sandboxes may not reach (private, link-local, loopback, the node itself)")
}

// resolverFor resolves with the node's resolvers, the ones sandboxes use,
// so that the proxy checks names against what sandboxes were told.
func resolverFor(resolvers []netip.Addr) *net.Resolver {
	if len(resolvers) == 0 {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		var last error
		for _, r := range resolvers {
			c, err := d.DialContext(ctx, network, netip.AddrPortFrom(r, 53).String())
			if err == nil {
				return c, nil
			}
			last = err
		}
		return nil, last
	}}
}

// auditGroup is the NFLOG group of a network prefix's slot chains: fixed
// per prefix, so that Warrens with distinct prefixes on one host do not
// read each other's.
func auditGroup(prefix string) uint16 {
	h := fnv.New32a()
	h.Write([]byte(prefix))
	return uint16(20000 + h.Sum32()%10000)
}

// sweep bounds the audit files of sandboxes that are gone, now and every
// auditSweep, until ctx ends.
func (e *egressParts) sweep(ctx context.Context, st store.Store, log *slog.Logger) {
	t := time.NewTicker(auditSweep)
	defer t.Stop()
	for {
		keep := func(id string) bool {
			sb, err := st.GetSandbox(ctx, id)
			return err == nil && sb.State != store.StateKilled
		}
		if err := e.audit.Sweep(keep, auditMaxAge, auditMaxTotal); err != nil {
			log.Warn("sweeping the egress audit", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
