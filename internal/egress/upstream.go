package egress

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// dialer makes the proxy's upstream connections: directly to an address
// the node lets sandboxes reach, or through an upstream CONNECT proxy
// that is itself at such an address.
type dialer struct {
	refused  func(netip.Addr) bool
	resolver Resolver
	timeout  time.Duration
	names    nameCache
}

// nameCache keeps what names resolved to for nameTTL: a sandbox that
// opens many connections to one host costs one lookup, not one each.
// The answers are the node's resolvers' (the ones the sandbox itself
// asked a moment before), and refused addresses are dropped after the
// cache, so a stale entry never opens what the node refuses. It also
// answers the reverse question, which names an address belongs to, so
// that the proxy can dial an allowed name's address before it has read
// the name (see conn.serve).
type nameCache struct {
	mu      sync.Mutex
	entries map[string]cachedName
	byAddr  map[netip.Addr][]string // names whose entry held the address when put; checked against entries on use
}

type cachedName struct {
	addrs []netip.Addr
	until time.Time
}

const (
	nameTTL        = 5 * time.Second
	maxCachedNames = 4096
	maxNamesByAddr = 16 // names kept per address (a CDN's address serves many)
)

func (c *nameCache) get(host string, now time.Time) ([]netip.Addr, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[host]
	if !ok || now.After(e.until) {
		return nil, false
	}
	return e.addrs, true
}

func (c *nameCache) put(host string, addrs []netip.Addr, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= maxCachedNames || len(c.byAddr) >= maxCachedNames {
		c.entries = map[string]cachedName{}
		c.byAddr = map[netip.Addr][]string{}
	}
	c.entries[host] = cachedName{addrs: addrs, until: now.Add(nameTTL)}
	for _, a := range addrs {
		a = a.Unmap()
		names := c.byAddr[a]
		if slices.Contains(names, host) {
			continue
		}
		if len(names) >= maxNamesByAddr {
			names = names[1:]
		}
		c.byAddr[a] = append(names, host)
	}
}

// named reports whether a name that match accepts resolved to addr (and
// still does, as far as the cache knows).
func (c *nameCache) named(addr netip.Addr, match func(host string) bool, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, host := range c.byAddr[addr] {
		e, ok := c.entries[host]
		if ok && !now.After(e.until) && slices.Contains(e.addrs, addr) && match(host) {
			return true
		}
	}
	return false
}

// errRefused: the node never lets sandboxes reach that address.
var errRefused = errors.New("the node refuses sandboxes that address")

// direct dials addr.
func (d *dialer) direct(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	if d.refused(addr.Addr()) {
		return nil, fmt.Errorf("%s: %w", addr, errRefused)
	}
	nd := net.Dialer{Timeout: d.timeout}
	return nd.DialContext(ctx, "tcp4", addr.String())
}

// resolve returns the IPv4 addresses host resolves to that the node lets
// sandboxes reach.
func (d *dialer) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	addrs, ok := d.names.get(host, time.Now())
	if !ok {
		ctx, cancel := context.WithTimeout(ctx, d.timeout)
		defer cancel()
		var err error
		if addrs, err = d.resolver.LookupNetIP(ctx, "ip4", host); err != nil {
			return nil, err
		}
		d.names.put(host, addrs, time.Now())
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a = a.Unmap(); !d.refused(a) {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s resolves to no address sandboxes may reach", host)
	}
	return out, nil
}

// viaProxy opens a tunnel to target ("host:port" or "ip:port") through
// the upstream proxy up, which must itself be at an address the node
// lets sandboxes reach. A name in target is sent as a name: the proxy
// resolves it. The whole handshake is bounded by the dial timeout.
func (d *dialer) viaProxy(ctx context.Context, up *UpstreamProxy, target string) (net.Conn, error) {
	proto, hostPort := up.Endpoint()
	c, err := d.dialProxy(ctx, hostPort)
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s: %w", up.Address, err)
	}
	hctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	var tunnel net.Conn
	switch proto {
	case ProtocolSOCKS5:
		tunnel, err = socks5Handshake(hctx, c, up, target)
	case ProtocolConnect:
		tunnel, err = connectHandshake(hctx, c, up, target)
	default:
		err = errors.New("it speaks no protocol Warren knows")
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("egress proxy %s: %w", up.Address, err)
	}
	return tunnel, nil
}

// dialProxy connects to an upstream proxy at hostPort, by the first
// address its name resolves to that the node lets sandboxes reach.
func (d *dialer) dialProxy(ctx context.Context, hostPort string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		if d.refused(a) {
			return nil, errRefused
		}
		addrs = []netip.Addr{a}
	} else if addrs, err = d.resolve(ctx, host); err != nil {
		return nil, err
	}
	p, err := netip.ParseAddrPort(net.JoinHostPort(addrs[0].String(), port))
	if err != nil {
		return nil, err
	}
	return d.direct(ctx, p)
}

// connectHandshake asks the HTTP CONNECT proxy on c for a tunnel to
// target.
func connectHandshake(ctx context.Context, c net.Conn, up *UpstreamProxy, target string) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if up.Username != "" {
		req += "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(up.Username+":"+up.Password)) + "\r\n"
	}
	if _, err := c.Write([]byte(req + "\r\n")); err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, fmt.Errorf("reading its answer: %w", err)
	}
	res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return nil, fmt.Errorf("it answered %s to CONNECT %s", res.Status, target)
	}
	_ = c.SetDeadline(time.Time{})
	return &bufferedConn{Conn: c, r: br}, nil
}

// bufferedConn reads what its reader buffered before the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the underlying TCP connection.
func (c *bufferedConn) CloseWrite() error { return closeWrite(c.Conn) }

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}
