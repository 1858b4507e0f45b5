package oci

// Which registries a pull may reach.
//
// An image reference in a template build is a tenant's choice, and the
// pull runs on the host: without a policy, "127.0.0.1:8080/x" or
// "169.254.169.254/x" would make the host send requests to its own
// services, the cloud's metadata endpoint or the operator's private
// network. So a pull speaks HTTPS only, and connects only to public
// addresses: loopback, private (RFC 1918, 100.64/10, fc00::/7), link-
// local, multicast, unspecified and reserved addresses are refused. The
// address is checked as the connection is made, after the name was
// resolved, so a name that resolves (or, rebinding, re-resolves) to such
// an address is refused too, and so is a redirect to one.
//
// The operator lifts this for named registries (warren serve
// --allow-insecure-registry HOST[:PORT], PullOptions.AllowInsecure) and,
// implicitly, for the registry mirror: those may be reached at any
// address and over plain HTTP.
//
// Pulls do not go through HTTP(S)_PROXY: a proxy would resolve and reach
// the registry itself, out of reach of the check.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrRegistryNotAllowed is wrapped by the errors of pulls the policy
// refused (a *RegistryRefusedError).
var ErrRegistryNotAllowed = errors.New("registry not allowed")

// RegistryRefusedError is a connection the policy refused: to Host
// ("host:port", as dialled), for Reason.
type RegistryRefusedError struct {
	Host   string
	Reason string
}

func (e *RegistryRefusedError) Error() string {
	return fmt.Sprintf("registry %s refused: %s; Warren pulls images over HTTPS from public addresses only: "+
		"if you trust this registry, start warren serve with --allow-insecure-registry %s", e.Host, e.Reason, e.Host)
}

func (e *RegistryRefusedError) Unwrap() error { return ErrRegistryNotAllowed }

// ParseRegistryHost splits "HOST" or "HOST:PORT" (an IPv6 address in
// brackets when it has a port) into a lowercase host and a port ("" for
// any).
func ParseRegistryHost(s string) (host, port string, err error) {
	bad := func(why string) (string, string, error) {
		return "", "", fmt.Errorf("registry %q: %s (want HOST or HOST:PORT)", s, why)
	}
	if s == "" || strings.ContainsAny(s, "/@?# \t") {
		return bad("not a host")
	}
	switch {
	case strings.HasPrefix(s, "["):
		if strings.HasSuffix(s, "]") {
			host = s[1 : len(s)-1]
		} else if host, port, err = net.SplitHostPort(s); err != nil {
			return bad(err.Error())
		}
	case strings.Count(s, ":") == 1:
		if host, port, err = net.SplitHostPort(s); err != nil {
			return bad(err.Error())
		}
	default:
		host = s // a name, an IPv4 address or a bare IPv6 address
	}
	if host == "" {
		return bad("no host")
	}
	if strings.Contains(host, ":") {
		if _, err := netip.ParseAddr(host); err != nil {
			return bad("not an IPv6 address")
		}
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return bad("invalid port")
		}
	}
	return strings.ToLower(host), port, nil
}

// registryPolicy is the registries a pull may reach despite the rules
// above.
type registryPolicy struct {
	allowed []allowedRegistry
}

type allowedRegistry struct {
	host, port string // port "" for any
}

// newRegistryPolicy allows the registries named in insecure and the
// mirror ("host:port" or "http(s)://host:port").
func newRegistryPolicy(insecure []string, mirror string) (*registryPolicy, error) {
	p := &registryPolicy{}
	names := insecure
	if mirror != "" {
		m := strings.TrimPrefix(strings.TrimPrefix(strings.TrimSuffix(mirror, "/"), "http://"), "https://")
		names = append(names[:len(names):len(names)], m)
	}
	for _, n := range names {
		host, port, err := ParseRegistryHost(n)
		if err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
		p.allowed = append(p.allowed, allowedRegistry{host, port})
	}
	return p, nil
}

// allows tells whether "host:port" is an allowed registry.
func (p *registryPolicy) allows(hostport string) bool {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	host = strings.ToLower(host)
	ip, ipErr := netip.ParseAddr(host)
	for _, a := range p.allowed {
		if a.port != "" && a.port != port {
			continue
		}
		if a.host == host {
			return true
		}
		if aip, err := netip.ParseAddr(a.host); err == nil && ipErr == nil && aip.Unmap() == ip.Unmap() {
			return true
		}
	}
	return false
}

var (
	cgnat     = netip.MustParsePrefix("100.64.0.0/10")
	thisNet   = netip.MustParsePrefix("0.0.0.0/8")
	reserved4 = netip.MustParsePrefix("240.0.0.0/4")
	siteLocal = netip.MustParsePrefix("fec0::/10")
	compat6   = netip.MustParsePrefix("::/96") // IPv4-compatible, deprecated
)

// refusedAddress says why a pull may not connect to a, or "" if it may.
func refusedAddress(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate(), cgnat.Contains(a), siteLocal.Contains(a):
		return "private"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	case a.IsUnspecified(), thisNet.Contains(a):
		return "unspecified"
	case reserved4.Contains(a), compat6.Contains(a):
		return "reserved"
	}
	return ""
}

// checkDialedAddress is the dialer's Control: it runs for each address a
// name resolved to, just before connecting to it.
func checkDialedAddress(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RegistryRefusedError{Host: address, Reason: "not an IP address"}
	}
	if why := refusedAddress(ap.Addr()); why != "" {
		article := "a"
		if strings.IndexByte("aeiou", why[0]) >= 0 {
			article = "an"
		}
		return &RegistryRefusedError{Reason: fmt.Sprintf("it is at %s %s address (%s)", article, why, ap.Addr().Unmap())}
	}
	return nil
}

// transport is go-containerregistry's default transport with the short
// timeouts of oci.go, no proxy, and the policy applied to every request
// and connection.
func (p *registryPolicy) transport() *policyTransport {
	open := &net.Dialer{Timeout: registryDialTimeout, KeepAlive: 30 * time.Second}
	checked := &net.Dialer{Timeout: registryDialTimeout, KeepAlive: 30 * time.Second, Control: checkDialedAddress}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p.allows(addr) {
			return open.DialContext(ctx, network, addr)
		}
		conn, err := checked.DialContext(ctx, network, addr)
		var refused *RegistryRefusedError
		if errors.As(err, &refused) {
			if refused.Host == "" {
				refused.Host = addr
			}
			return nil, refused // not a dial error: pullError must not call it "offline"
		}
		return conn, err
	}
	return &policyTransport{policy: p, Transport: &http.Transport{
		DialContext:           dial,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   registryTLSTimeout,
		ResponseHeaderTimeout: registryHeaderTimeout,
		ExpectContinueTimeout: time.Second,
	}}
}

// policyTransport refuses plain HTTP to registries that are not allowed.
type policyTransport struct {
	*http.Transport
	policy *registryPolicy
}

func (t *policyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" {
		if hp := hostPort(req.URL); !t.policy.allows(hp) {
			return nil, &RegistryRefusedError{Host: hp, Reason: "it would be spoken to over plain " + req.URL.Scheme}
		}
	}
	return t.Transport.RoundTrip(req)
}

// hostPort is u's host with its port, the scheme's default if it names
// none.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}
