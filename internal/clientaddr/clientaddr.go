// Package clientaddr tells the address of the client behind a request on
// Warren's public listeners (the API and the sandbox proxy, HTTP and
// HTTPS), which key the failed-authentication budgets and reach sandboxes
// as X-Forwarded-For.
//
// Behind a load balancer every TCP peer is the balancer. The operator
// names the proxies it trusts (`warren serve --trusted-proxy CIDR`), and
// only a connection whose TCP peer is one of them may say who the client
// is: by the PROXY protocol (v1 or v2, github.com/pires/go-proxyproto),
// whose header is then optional, or by X-Forwarded-For, of which the
// rightmost hop that is not itself a trusted proxy is the client. From any
// other peer both are ignored: a PROXY header is not parsed at all (the
// connection is served as it came, and its request is malformed), and
// X-Forwarded-For, Forwarded and X-Real-Ip are removed from the request,
// so that nothing downstream (a sandbox's app) mistakes a client's claim
// for Warren's.
//
// With no trusted proxies (the default) every peer is the client and
// those headers are removed from every request.
package clientaddr

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/pires/go-proxyproto"
)

// Prefixes are the trusted proxies' addresses. As a command-line flag it
// is repeatable and each value may hold several, separated by commas: a
// CIDR range or a single address, IPv4 or IPv6.
type Prefixes []netip.Prefix

func (p *Prefixes) String() string {
	if p == nil {
		return ""
	}
	s := make([]string, len(*p))
	for i, x := range *p {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// Set adds the ranges of one flag value.
func (p *Prefixes) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		pfx, err := parsePrefix(part)
		if err != nil {
			return err
		}
		*p = append(*p, pfx)
	}
	return nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR range such as 10.0.0.0/8", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	pfx, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR range such as 10.0.0.0/8", s)
	}
	if pfx.Addr().Is4In6() {
		// ::ffff:10.0.0.0/104 is 10.0.0.0/8: peers are compared unmapped.
		if pfx.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("%q mixes IPv4-mapped and IPv6 addresses", s)
		}
		pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
	}
	return pfx.Masked(), nil
}

// Trusted says which peers are trusted proxies. The zero value (and nil)
// trusts none. It is safe for concurrent use once made.
type Trusted struct {
	prefixes []netip.Prefix
}

// New returns the Trusted of prefixes. A prefix that is not valid is an
// error.
func New(prefixes []netip.Prefix) (*Trusted, error) {
	t := &Trusted{}
	for _, p := range prefixes {
		if !p.IsValid() {
			return nil, errors.New("clientaddr: an invalid trusted proxy range")
		}
		t.prefixes = append(t.prefixes, p.Masked())
	}
	return t, nil
}

// Contains reports whether a is a trusted proxy's address.
func (t *Trusted) Contains(a netip.Addr) bool {
	if t == nil || !a.IsValid() {
		return false
	}
	a = a.Unmap().WithZone("")
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ReadHeaderTimeout bounds how long a trusted proxy's connection may take
// to send its PROXY header (or its first bytes, when it sends none).
const ReadHeaderTimeout = 10 * time.Second

// Listen wraps ln with the PROXY protocol for trusted peers: a connection
// from one may open with a PROXY header (v1 or v2), whose source address
// becomes the connection's RemoteAddr (a LOCAL header, a health check,
// keeps the peer's). A connection from any other peer is returned as it
// was accepted, its bytes unread. With no trusted proxies, ln itself.
func (t *Trusted) Listen(ln net.Listener) net.Listener {
	if t == nil || len(t.prefixes) == 0 {
		return ln
	}
	return &proxyproto.Listener{
		Listener:          ln,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ConnPolicy: func(o proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
			if t.Contains(addrOf(o.Upstream)) {
				// The header is optional: a trusted HTTP proxy sends
				// X-Forwarded-For instead.
				return proxyproto.USE, nil
			}
			return proxyproto.SKIP, nil
		},
	}
}

// addrOf is a net.Addr's IP address, if it has one.
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case nil:
		return netip.Addr{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// forwardingHeaders are what clients claim about their address; only a
// trusted proxy's X-Forwarded-For is read, and none reaches a handler
// unchecked.
var forwardingHeaders = []string{"X-Forwarded-For", "Forwarded", "X-Real-Ip"}

// Handler sets each request's RemoteAddr to its client's address before h
// sees it: the TCP peer's (after the PROXY protocol), or, when that is a
// trusted proxy, the rightmost hop of X-Forwarded-For that is not one
// (Client). X-Forwarded-For is left holding the hops before the client
// (those it claims; a reverse proxy appends the client to them), and
// Forwarded and X-Real-Ip are removed.
func (t *Trusted) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer, err := netip.ParseAddrPort(r.RemoteAddr)
		xff := r.Header.Values("X-Forwarded-For")
		r2 := new(http.Request)
		*r2 = *r
		r2.Header = r.Header.Clone()
		for _, k := range forwardingHeaders {
			r2.Header.Del(k)
		}
		if err == nil && len(xff) > 0 {
			client, before, ok := t.Client(peer.Addr(), xff)
			if ok {
				r2.RemoteAddr = netip.AddrPortFrom(client, 0).String()
				if len(before) > 0 {
					r2.Header.Set("X-Forwarded-For", strings.Join(before, ", "))
				}
			}
		}
		h.ServeHTTP(w, r2)
	})
}

// Client finds the client of a request from peer (its TCP peer) that
// carries the X-Forwarded-For values xff (each a comma-separated list of
// hops, oldest first). Only when peer is a trusted proxy does xff count:
// then the client is the rightmost hop that is not a trusted proxy, or
// the leftmost one when all are. A hop that is not an address (IPv4,
// IPv6, either with a port) ends the walk: nothing left of it can be
// believed, and the client is the trusted hop right of it. It returns the
// hops left of the client as given, and false when peer is the client.
func (t *Trusted) Client(peer netip.Addr, xff []string) (client netip.Addr, before []string, ok bool) {
	peer = peer.Unmap()
	if !t.Contains(peer) {
		return peer, nil, false
	}
	var hops []string
	for _, v := range xff {
		for _, h := range strings.Split(v, ",") {
			hops = append(hops, strings.TrimSpace(h))
		}
	}
	client = peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			break
		}
		client, before = a, hops[:i]
		if !t.Contains(a) {
			break
		}
	}
	if client == peer && before == nil {
		return peer, nil, false
	}
	return client, before, true
}

// parseHop reads one X-Forwarded-For hop: an address, with or without a
// port (an IPv6 one in brackets then).
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}
