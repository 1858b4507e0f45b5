package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Sandbox is what the proxy knows of a sandbox whose TCP it receives.
type Sandbox struct {
	ID, TeamID string
	Policy     Policy
}

// Resolver looks host names up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// SecretLookup returns the current value of a team's secret by name.
type SecretLookup func(ctx context.Context, teamID, name string) (string, error)

// TokenMinter mints a workload identity token for a team's sandbox
// (identity.Signer.Mint).
type TokenMinter func(teamID, sandboxID, audience string) (string, error)

// ProxyConfig configures a Proxy.
type ProxyConfig struct {
	// Refused reports the addresses the node never lets sandboxes reach
	// (network.Manager.Refused). Required.
	Refused func(netip.Addr) bool
	// Resolver resolves host names as sandboxes do (the node's
	// resolvers). Default: the host's resolver.
	Resolver Resolver
	// CA issues the certificates for intercepted hosts; nil: a host with
	// rules cannot be reached over TLS.
	CA *CA
	// RootCAs verify the real hosts of intercepted connections; nil: the
	// host's system roots.
	RootCAs *x509.CertPool
	// Secrets resolves ${e2b.secrets.NAME}; nil: rules that use one fail.
	Secrets SecretLookup
	// Identity mints ${e2b.identity.tokens.NAME}; nil: rules that use
	// one fail.
	Identity TokenMinter
	// Audit gets every decision; nil: none is written.
	Audit *Audit
	// SniffTimeout bounds the wait for a client's first bytes, and
	// DialTimeout each upstream dial. Defaults 5 s and 10 s.
	SniffTimeout, DialTimeout time.Duration
	// IdleTimeout closes an intercepted connection idle that long.
	// Default 5 min.
	IdleTimeout time.Duration
	// OriginalDst finds where a redirected connection was going.
	// Default: SO_ORIGINAL_DST (tests replace it).
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	Logger      *slog.Logger
}

// Proxy is the node's transparent egress proxy (see the package doc).
type Proxy struct {
	cfg  ProxyConfig
	dial dialer
	log  *slog.Logger

	mu        sync.Mutex
	sandboxes map[netip.Addr]*registration // by sandbox address
	closed    bool
	lns       []net.Listener
	active    map[net.Conn]struct{} // client connections being served
	wg        sync.WaitGroup

	// strays limits the warnings about connections that are no
	// redirected sandbox's (the node's rules let none in, so they mean a
	// broken rule set, and must not flood the log if one does);
	// suppressed counts the ones not logged since the last.
	strays     *rate.Limiter
	suppressed atomic.Int64
}

type registration struct {
	sb    Sandbox
	flows map[*flow]struct{}
}

// flow is a connection the proxy let through, judged again when the
// sandbox's policy changes.
type flow struct {
	dst   netip.AddrPort
	host  string
	close func()
}

// NewProxy returns a proxy; Serve runs it.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if cfg.Refused == nil {
		return nil, errors.New("egress: Config.Refused is required")
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.SniffTimeout <= 0 {
		cfg.SniffTimeout = 5 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Proxy{
		cfg: cfg, log: cfg.Logger, sandboxes: map[netip.Addr]*registration{}, active: map[net.Conn]struct{}{},
		dial:   dialer{refused: cfg.Refused, resolver: cfg.Resolver, timeout: cfg.DialTimeout},
		strays: rate.NewLimiter(strayWarnRate, strayWarnBurst),
	}, nil
}

// Register tells the proxy the sandbox at addr, or gives it a new policy.
// Connections the new policy forbids are cut (reset) at once.
func (p *Proxy) Register(addr netip.Addr, sb Sandbox) {
	p.mu.Lock()
	r := p.sandboxes[addr]
	if r == nil {
		r = &registration{flows: map[*flow]struct{}{}}
		p.sandboxes[addr] = r
	}
	r.sb = sb
	var cut []*flow
	for f := range r.flows {
		if v := judge(sb.Policy, f.dst, f.host); !v.allow {
			cut = append(cut, f)
		}
	}
	p.mu.Unlock()
	for _, f := range cut {
		f.close()
	}
}

// Unregister forgets the sandbox at addr and cuts its connections.
func (p *Proxy) Unregister(addr netip.Addr) {
	p.mu.Lock()
	r := p.sandboxes[addr]
	delete(p.sandboxes, addr)
	p.mu.Unlock()
	if r == nil {
		return
	}
	for f := range r.flows {
		f.close()
	}
}

// Serve accepts redirected connections on ln until Close.
func (p *Proxy) Serve(ln net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return net.ErrClosed
	}
	p.lns = append(p.lns, ln)
	p.mu.Unlock()
	done := make(chan error, 1)
	go p.accept(ln, done)
	return <-done
}

// accept takes the next connection from ln and serves it, after starting
// the goroutine that takes the one after: the connection's first steps
// run on the goroutine that is already awake instead of waiting for a new
// one to be scheduled, which on a node whose cores are busy with
// sandboxes can take a while. The acceptor that fails ends Serve.
func (p *Proxy) accept(ln net.Listener, done chan<- error) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				done <- nil
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			done <- err
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			done <- nil
			return
		}
		p.active[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.accept(ln, done)
		p.serveConn(c)
		return
	}
}

func (p *Proxy) serveConn(c net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.active, c)
		p.mu.Unlock()
	}()
	p.handle(c)
}

// Close stops the listeners and cuts every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	lns := p.lns
	var flows []*flow
	for _, r := range p.sandboxes {
		for f := range r.flows {
			flows = append(flows, f)
		}
	}
	var active []net.Conn
	for c := range p.active {
		active = append(active, c)
	}
	p.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, f := range flows {
		f.close()
	}
	for _, c := range active {
		reset(c)
	}
	p.wg.Wait()
	return nil
}

func (p *Proxy) lookup(addr netip.Addr) (Sandbox, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.sandboxes[addr]
	if r == nil {
		return Sandbox{}, false
	}
	return r.sb, true
}

// track records an allowed connection of the sandbox at addr; it reports
// false if the sandbox is gone or its policy changed so that the
// connection is not allowed any more.
func (p *Proxy) track(addr netip.Addr, f *flow) (untrack func(), ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.sandboxes[addr]
	if r == nil || !judge(r.sb.Policy, f.dst, f.host).allow {
		return nil, false
	}
	r.flows[f] = struct{}{}
	return func() {
		p.mu.Lock()
		delete(r.flows, f)
		p.mu.Unlock()
	}, true
}

// verdict is what a policy says about a connection.
type verdict struct {
	allow  bool
	rule   string
	domain bool // allowed by a domain: only to an address of that name
}

// judge applies a policy to a connection to dst that named host ("" for
// none): address allow, then domain allow, then address deny, then the
// default (see the package doc).
func judge(pol Policy, dst netip.AddrPort, host string) verdict {
	a := dst.Addr().Unmap()
	if pfx, ok := firstContaining(pol.Allow, a); ok {
		return verdict{allow: true, rule: "allowOut " + pfx.String()}
	}
	if pattern, ok := pol.AllowsHost(host); ok {
		return verdict{allow: true, rule: "allowOut " + pattern, domain: true}
	}
	if pfx, ok := firstContaining(pol.Deny, a); ok {
		return verdict{rule: "denyOut " + pfx.String()}
	}
	return verdict{allow: true, rule: "default"}
}

func firstContaining(ps []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, p := range ps {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// handle serves one redirected connection.
func (p *Proxy) handle(c net.Conn) {
	defer func() {
		if v := recover(); v != nil {
			p.log.Error("egress proxy: panic", "panic", v, "stack", string(debug.Stack()))
			reset(c)
		}
	}()
	src, ok := netip.AddrFromSlice(c.RemoteAddr().(*net.TCPAddr).IP)
	src = src.Unmap()
	sb, known := p.lookup(src)
	if !ok || !known {
		p.warnStray("egress proxy: a connection from an address that is no proxied sandbox", "from", c.RemoteAddr())
		reset(c)
		return
	}
	dst, err := p.cfg.OriginalDst(c)
	if err != nil || dst.Addr() == netip.MustParseAddrPort(c.LocalAddr().String()).Addr() && dst.Port() == netip.MustParseAddrPort(c.LocalAddr().String()).Port() {
		p.warnStray("egress proxy: a connection that was not redirected", "from", c.RemoteAddr(), "err", err)
		reset(c)
		return
	}
	e := Entry{Sandbox: sb.ID, Team: sb.TeamID, Proto: string(KindOther), Dst: dst.String()}
	cn := &conn{p: p, client: c, sb: sb, src: src, dst: dst, entry: e}
	cn.serve()
}

// At most strayWarnBurst warnings about stray connections at once, then
// one per second, each saying how many were not logged.
const (
	strayWarnRate  = rate.Limit(1)
	strayWarnBurst = 5
)

func (p *Proxy) warnStray(msg string, args ...any) {
	if !p.strays.Allow() {
		p.suppressed.Add(1)
		return
	}
	p.log.Warn(msg, append(args, "not_logged_since_last", p.suppressed.Swap(0))...)
}

// conn is one connection being decided and relayed.
type conn struct {
	p      *Proxy
	client net.Conn
	sb     Sandbox
	src    netip.Addr
	dst    netip.AddrPort
	entry  Entry
}

func (cn *conn) deny(rule, reason string) {
	cn.entry.Decision, cn.entry.Rule, cn.entry.Reason = Deny, rule, reason
	cn.p.cfg.Audit.Log(cn.entry)
	reset(cn.client)
}

func (cn *conn) serve() {
	p, pol := cn.p, cn.sb.Policy
	if p.cfg.Refused(cn.dst.Addr()) {
		cn.deny("node", "the node refuses sandboxes this address")
		return
	}
	addrVerdict := judge(pol, cn.dst, "")
	if !addrVerdict.allow && len(pol.Domains) == 0 {
		cn.deny(addrVerdict.rule, "")
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var early *earlyDial
	switch {
	case addrVerdict.allow:
		// The address is allowed whatever the first bytes say: dial now,
		// and splice at once if the server speaks first (SSH, SMTP).
		early = cn.startDial(ctx, true)
	case pol.Upstream == nil && p.dial.names.named(cn.dst.Addr(), func(h string) bool { _, ok := pol.AllowsHost(h); return ok }, time.Now()):
		// The address is one an allowed name resolved to a moment ago
		// (most likely the sandbox just looked that name up): dial it
		// while the client's first bytes come, so that the dial is not
		// on the connection's path. Nothing is sent on it, and it is
		// closed unless those bytes name an allowed host; the sandbox
		// could open that address anyway by naming the host.
		early = cn.startDial(ctx, false)
	}
	first, serverFirst := cn.firstBytes(early)
	if serverFirst {
		cn.entry.Decision, cn.entry.Rule = Allow, addrVerdict.rule
		cn.relay(early, first.data)
		return
	}
	cn.entry.Proto = string(first.kind)
	host := ""
	if first.kind != KindOther {
		host = NormalizeHost(first.host)
		cn.entry.Host = first.host
	}
	v := judge(pol, cn.dst, host)
	if !v.allow {
		early.abandon()
		if len(first.data) == 0 {
			cn.deny(v.rule, "no bytes from the client to read a host name from")
		} else {
			cn.deny(v.rule, "")
		}
		return
	}
	rule, hasRule := HostRule{}, false
	if host != "" && first.kind != KindOther {
		rule, hasRule = pol.RuleFor(host)
	}
	up, err := cn.upstream(ctx, early, host, v.domain || hasRule)
	if err != nil {
		cn.deny(v.rule, err.Error())
		return
	}
	cn.entry.Decision, cn.entry.Rule = Allow, v.rule
	f := &flow{dst: cn.dst, host: host, close: func() { reset(cn.client); reset(up) }}
	untrack, ok := p.track(cn.src, f)
	if !ok {
		reset(up)
		cn.deny(v.rule, "the sandbox's policy changed meanwhile")
		return
	}
	defer untrack()
	switch {
	case hasRule && first.kind == KindTLS:
		cn.interceptTLS(up, first.data, host, rule)
	case hasRule && first.kind == KindHTTP:
		p.cfg.Audit.Log(cn.entry)
		cn.relayHTTP(&prefixConn{Conn: cn.client, prefix: first.data}, up, host, &rule)
	case first.kind == KindHTTP:
		// Request by request: each keep-alive request is judged by the
		// host it names (relayHTTP).
		p.cfg.Audit.Log(cn.entry)
		cn.relayHTTP(&prefixConn{Conn: cn.client, prefix: first.data}, up, host, nil)
	default:
		p.cfg.Audit.Log(cn.entry)
		splice(&prefixConn{Conn: cn.client, prefix: first.data}, up)
	}
}

// upstream returns the connection to use: the early one when it goes
// where it should, else a new one. With verify (a domain allowance or a
// host with rules), the server must be at an address host resolves to,
// whatever the sandbox dialled.
func (cn *conn) upstream(ctx context.Context, early *earlyDial, host string, verify bool) (net.Conn, error) {
	p, pol := cn.p, cn.sb.Policy
	port := strconv.Itoa(int(cn.dst.Port()))
	target := cn.dst
	if verify {
		if pol.Upstream != nil {
			// The upstream proxy resolves the name itself.
			early.abandon()
			cn.entry.Via = pol.Upstream.Address
			return p.dial.viaProxy(ctx, pol.Upstream, net.JoinHostPort(host, port))
		}
		addrs, err := p.dial.resolve(ctx, host)
		if err != nil {
			early.abandon()
			return nil, err
		}
		if !slices.Contains(addrs, cn.dst.Addr()) {
			target = netip.AddrPortFrom(addrs[0], cn.dst.Port())
			cn.entry.Via = target.String()
		}
	}
	if early != nil && target == cn.dst {
		c, err := early.wait()
		if err != nil {
			return nil, err
		}
		if pol.Upstream != nil {
			cn.entry.Via = pol.Upstream.Address
		}
		return c, nil
	}
	early.abandon()
	if pol.Upstream != nil {
		cn.entry.Via = pol.Upstream.Address
		return p.dial.viaProxy(ctx, pol.Upstream, target.String())
	}
	return p.dial.direct(ctx, target)
}

// earlyDial is an upstream connection made while the client's first
// bytes are awaited, and, if watched, what the server sent before the
// client spoke.
type earlyDial struct {
	ready chan struct{} // closed when the dial ended
	conn  net.Conn
	err   error
	watch bool          // the server's first bytes are being read
	spoke chan struct{} // closed when the server sent bytes first
	first []byte        // those bytes (or any read before stop)
	read  chan struct{} // closed when the first read ended
}

// startDial dials the original destination; with watch, it then reads
// what the server says first (see firstBytes).
func (cn *conn) startDial(ctx context.Context, watch bool) *earlyDial {
	d := &earlyDial{ready: make(chan struct{}), watch: watch, spoke: make(chan struct{}), read: make(chan struct{})}
	go func() {
		defer close(d.read)
		pol := cn.sb.Policy
		if pol.Upstream != nil {
			d.conn, d.err = cn.p.dial.viaProxy(ctx, pol.Upstream, cn.dst.String())
		} else {
			d.conn, d.err = cn.p.dial.direct(ctx, cn.dst)
		}
		close(d.ready)
		if d.err != nil || !watch {
			return
		}
		buf := make([]byte, 4096)
		n, _ := d.conn.Read(buf)
		if n > 0 {
			d.first = buf[:n]
			close(d.spoke)
		}
	}()
	return d
}

// stop ends the watch for server-first bytes; what was read stays in first.
func (d *earlyDial) stop() {
	<-d.ready
	if d.conn != nil && d.watch {
		_ = d.conn.SetReadDeadline(time.Now())
		<-d.read
		_ = d.conn.SetReadDeadline(time.Time{})
	}
}

// wait returns the dialled connection, with what the server sent first
// replayed to whoever reads it.
func (d *earlyDial) wait() (net.Conn, error) {
	d.stop()
	if d.err != nil {
		return nil, d.err
	}
	if len(d.first) > 0 {
		return &prefixConn{Conn: d.conn, prefix: d.first}, nil
	}
	return d.conn, nil
}

// abandon closes the early connection, if any.
func (d *earlyDial) abandon() {
	if d == nil {
		return
	}
	go func() {
		<-d.ready
		if d.conn != nil {
			d.conn.Close()
		}
	}()
}

// firstBytes sniffs the client's first bytes, unless the early upstream,
// if watched, speaks first.
func (cn *conn) firstBytes(early *earlyDial) (sniffResult, bool) {
	_ = cn.client.SetReadDeadline(time.Now().Add(cn.p.cfg.SniffTimeout))
	defer cn.client.SetReadDeadline(time.Time{})
	if early == nil || !early.watch {
		r, _ := sniff(cn.client)
		return r, false
	}
	done := make(chan sniffResult, 1)
	go func() {
		r, _ := sniff(cn.client)
		done <- r
	}()
	select {
	case r := <-done:
		return r, false
	case <-early.spoke:
		_ = cn.client.SetReadDeadline(time.Now())
		return <-done, true
	}
}

// relay splices the client to the early upstream once the server spoke
// first; clientData is what the client had sent meanwhile.
func (cn *conn) relay(early *earlyDial, clientData []byte) {
	up, err := early.wait()
	if err != nil {
		cn.deny(cn.entry.Rule, err.Error())
		return
	}
	f := &flow{dst: cn.dst, close: func() { reset(cn.client); reset(up) }}
	untrack, ok := cn.p.track(cn.src, f)
	if !ok {
		reset(up)
		cn.deny(cn.entry.Rule, "the sandbox's policy changed meanwhile")
		return
	}
	defer untrack()
	cn.p.cfg.Audit.Log(cn.entry)
	splice(&prefixConn{Conn: cn.client, prefix: clientData}, up)
}

// splice copies both ways until both sides are done, half-closing each
// direction as it ends; an error in one direction ends both. The calling
// goroutine copies a to b, so that what a's prefix holds (the client's
// first bytes) goes on at once; a new one copies b to a.
func splice(a, b net.Conn) {
	cp := func(dst, src net.Conn) error {
		_, err := copyConn(dst, src)
		if err == nil {
			err = closeWrite(dst)
		}
		if err != nil {
			a.Close()
			b.Close()
		}
		return err
	}
	back := make(chan struct{})
	go func() {
		defer close(back)
		cp(a, b)
	}()
	cp(b, a)
	<-back
	a.Close()
	b.Close()
}

// copyConn copies src to dst; a prefixConn's prefix goes first, then the
// rest through io.Copy (splice(2) between two TCP connections).
func copyConn(dst, src net.Conn) (int64, error) {
	var n int64
	if pc, ok := src.(*prefixConn); ok {
		if len(pc.prefix) > 0 {
			m, err := dst.Write(pc.prefix)
			n += int64(m)
			pc.prefix = nil
			if err != nil {
				return n, err
			}
		}
		src = pc.Conn
	}
	if pc, ok := dst.(*prefixConn); ok {
		dst = pc.Conn
	}
	m, err := copyBuffer(dst, src)
	return n + m, err
}

// copyBuffer is io.Copy: between two *net.TCPConn it splices in the
// kernel.
var copyBuffer = io.Copy
