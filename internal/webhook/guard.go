package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// ErrRefused is returned (wrapped) for a webhook URL, or an address it
// resolves to, that the guard refuses.
var ErrRefused = errors.New("refused")

// MaxURLLength bounds a webhook's URL.
const MaxURLLength = 2048

// internalRanges are addresses a webhook may not reach unless the
// operator allows them: this host, private networks, link-local (cloud
// metadata: 169.254.169.254, fd00:ec2::254 is in fc00::/7), carrier NAT,
// benchmarking, reserved and multicast ranges, and IPv6 forms that embed
// an IPv4 address (NAT64, 6to4, Teredo).
var internalRanges = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
	"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
	"203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/32", "2001:db8::/32", "2002::/16",
	"fc00::/7", "fe80::/10", "ff00::/8",
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Guard decides which addresses webhooks may reach: any public address,
// and internal ones only in Allow (--webhook-allow-cidr).
type Guard struct {
	Allow []netip.Prefix
}

// Permits reports whether a webhook may connect to addr.
func (g *Guard) Permits(addr netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.IsValid() || addr.Zone() != "" {
		return false
	}
	for _, p := range g.Allow {
		if p.Contains(addr) {
			return true
		}
	}
	for _, p := range internalRanges {
		if p.Contains(addr) {
			return false
		}
	}
	return addr.IsGlobalUnicast()
}

// CheckURL validates a webhook URL where it enters (the API): http or
// https, a host, no credentials or fragment, and, when the host is an
// address or a name of this host ("localhost"), one the guard permits.
// Names are resolved, and checked again, at each delivery.
func (g *Guard) CheckURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, fmt.Errorf("%w: the url is required", ErrRefused)
	}
	if len(raw) > MaxURLLength {
		return nil, fmt.Errorf("%w: the url is longer than %d characters", ErrRefused, MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: the url does not parse", ErrRefused)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: the url's scheme must be http or https", ErrRefused)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: the url may not carry credentials", ErrRefused)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("%w: the url may not have a fragment", ErrRefused)
	}
	host := u.Hostname()
	if host == "" {
		return nil, fmt.Errorf("%w: the url has no host", ErrRefused)
	}
	if p := u.Port(); p != "" {
		if n, err := parsePort(p); err != nil || n == 0 {
			return nil, fmt.Errorf("%w: the url's port is invalid", ErrRefused)
		}
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if !g.Permits(addr) {
			return nil, fmt.Errorf("%w: the url's address %s is internal (loopback, private, link-local or reserved)", ErrRefused, addr)
		}
		return u, nil
	}
	if localName(host) && !g.Permits(netip.MustParseAddr("127.0.0.1")) {
		return nil, fmt.Errorf("%w: the url's host %q is this host", ErrRefused, host)
	}
	if strings.Trim(host, ".") == "" || strings.ContainsAny(host, " %") {
		return nil, fmt.Errorf("%w: the url's host is invalid", ErrRefused)
	}
	return u, nil
}

func parsePort(p string) (int, error) {
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return 0, errors.New("not a number")
		}
		n = n*10 + int(c-'0')
		if n > 65535 {
			return 0, errors.New("too large")
		}
	}
	return n, nil
}

// localName tells names that are this host's whatever DNS says.
func localName(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost") || h == "localhost.localdomain" ||
		h == "ip6-localhost" || h == "ip6-loopback"
}

// Resolver looks host names up (*net.Resolver; tests give fakes).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// pin resolves host once and returns the first address the guard
// permits; every address it resolves to is refused if any is internal
// and not allowed (a name that also points inside is not trusted).
func (g *Guard) pin(ctx context.Context, r Resolver, host string) (netip.Addr, error) {
	if addr, err := netip.ParseAddr(host); err == nil {
		if !g.Permits(addr) {
			return netip.Addr{}, fmt.Errorf("%w: %s is internal", ErrRefused, addr)
		}
		return addr.Unmap(), nil
	}
	if localName(host) && !g.Permits(netip.MustParseAddr("127.0.0.1")) {
		return netip.Addr{}, fmt.Errorf("%w: %q is this host", ErrRefused, host)
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("resolving %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("resolving %s: no addresses", host)
	}
	for _, a := range addrs {
		if !g.Permits(a) {
			return netip.Addr{}, fmt.Errorf("%w: %s resolves to %s, which is internal", ErrRefused, host, a.Unmap())
		}
	}
	return addrs[0].Unmap(), nil
}

// control refuses, at the socket, a connection to an address the guard
// does not permit: whatever resolved it, nothing internal is reached.
func (g *Guard) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrRefused, address)
	}
	if !g.Permits(ap.Addr()) {
		return fmt.Errorf("%w: %s is internal", ErrRefused, ap.Addr())
	}
	return nil
}

// dialer returns a DialContext that connects to pinned whatever address
// the transport asks for (the URL's host: resolved once, by pin), through
// the guard's check at the socket.
func (g *Guard) dialer(pinned netip.Addr, d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d.Control = g.control
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		return d.DialContext(ctx, "tcp", net.JoinHostPort(pinned.String(), port))
	}
}
