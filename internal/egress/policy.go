package egress

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"unicode/utf8"

	"golang.org/x/net/http/httpguts"
)

// Config is a sandbox's egress configuration as the API takes it (the
// network object's allowOut, denyOut, rules and egressProxy, and
// allow_internet_access). It is what the sandbox's record keeps.
type Config struct {
	AllowOut    []string          `json:"allowOut,omitempty"`
	DenyOut     []string          `json:"denyOut,omitempty"`
	Rules       map[string][]Rule `json:"rules,omitempty"`
	EgressProxy *UpstreamProxy    `json:"egressProxy,omitempty"`
	// Identity is the sandbox's workload identity tokens (its create's
	// iam.tokens): the audience of each, by name. A rule may refer only
	// to these (${e2b.identity.tokens.NAME}).
	Identity map[string]string `json:"-"`
}

// Rule is one entry of a host's rules: a transform of its requests.
type Rule struct {
	Transform *Transform `json:"transform,omitempty"`
}

// Transform sets headers on matching outbound HTTP requests. Values may
// hold ${e2b.secrets.NAME} and ${e2b.identity.tokens.NAME} placeholders,
// resolved per request.
type Transform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// UpstreamProxy is the proxy all of a sandbox's TCP egress is sent
// through. At "host:port" (or "socks5://host:port") it is a SOCKS5 proxy
// (RFC 1928, with RFC 1929 user/password when Username is set), as
// E2B's egressProxy is; at "http://host:port" it is an HTTP CONNECT
// proxy (Basic credentials), which E2B does not have. Password is never
// returned by the API.
type UpstreamProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// ProxyProtocol is what an upstream proxy speaks.
type ProxyProtocol string

const (
	ProtocolSOCKS5  ProxyProtocol = "socks5"
	ProtocolConnect ProxyProtocol = "http"
)

// Endpoint returns what u speaks and its "host:port", from Address's
// scheme: none or socks5:// is SOCKS5, http:// is HTTP CONNECT.
func (u UpstreamProxy) Endpoint() (ProxyProtocol, string) {
	a := strings.TrimSpace(u.Address)
	scheme, rest, ok := strings.Cut(a, "://")
	if !ok {
		return ProtocolSOCKS5, a
	}
	switch strings.ToLower(scheme) {
	case "socks5", "socks5h":
		return ProtocolSOCKS5, rest
	case "http":
		return ProtocolConnect, rest
	}
	return "", rest
}

// AllTraffic is the CIDR that allow_internet_access=false denies.
const AllTraffic = "0.0.0.0/0"

// Limits on what one sandbox's configuration may hold. A thousand CIDRs
// cost the kernel the same as one (nftables interval sets); the limits
// bound the memory and the work of a policy update.
const (
	MaxAddressEntries  = 4096 // CIDRs and IPs in allowOut, and in denyOut
	MaxDomains         = 512  // domains in allowOut
	MaxRuleDomains     = 32
	MaxRulesPerDomain  = 1
	MaxHeadersPerRule  = 20
	MaxHeaderNameLen   = 64
	MaxHeaderValueLen  = 2048
	MaxSecretsPerRule  = 32
	maxDomainLen       = 253
	maxProxyCredential = 255
)

// ErrInvalid marks a configuration the API must refuse with a 400.
var ErrInvalid = errors.New("invalid network configuration")

// Policy is a Config checked and compiled for enforcement.
type Policy struct {
	// Allow and Deny are the address rules: allow wins over deny, and
	// whatever neither names is allowed.
	Allow, Deny []netip.Prefix
	// Domains are allowOut's host patterns: "example.com", "*.example.com"
	// or "*". They allow TCP connections whose TLS SNI or HTTP Host
	// matches, and nothing else.
	Domains []string
	// Rules are the transforms of requests to matching hosts.
	Rules []HostRule
	// Upstream, if set, carries all TCP egress (SOCKS5 or CONNECT).
	Upstream *UpstreamProxy
	// Identity is Config.Identity: the tokens the rules may mint, the
	// audience of each by name.
	Identity map[string]string
}

// HostRule is the transforms of one host pattern.
type HostRule struct {
	Pattern string
	Headers []Header
}

// Header is a header a rule sets; Value may hold placeholders.
type Header struct {
	Name, Value string
	Secrets     []string // the secret names Value refers to
	Tokens      []string // the identity tokens Value refers to
}

// Compile checks cfg and returns its policy; allowInternet false adds a
// deny of all traffic. A refused configuration is an ErrInvalid naming
// the offending entry.
func Compile(cfg Config, allowInternet bool) (Policy, error) {
	var p Policy
	var err error
	var allowAddrs []string
	for _, e := range cfg.AllowOut {
		e = strings.TrimSpace(e)
		if isAddress(e) {
			allowAddrs = append(allowAddrs, e)
			continue
		}
		d, err := normalizePattern(e)
		if err != nil {
			return Policy{}, fmt.Errorf("%w: allowOut entry %q is neither a CIDR, an IP address nor a domain: %v", ErrInvalid, e, err)
		}
		p.Domains = append(p.Domains, d)
	}
	if p.Allow, err = parsePrefixes("allowOut", allowAddrs); err != nil {
		return Policy{}, err
	}
	for _, e := range cfg.DenyOut {
		if !isAddress(strings.TrimSpace(e)) {
			return Policy{}, fmt.Errorf("%w: denyOut entry %q is not a CIDR or an IP address (domains can only be allowed)", ErrInvalid, e)
		}
	}
	deny := slices.Clone(cfg.DenyOut)
	if !allowInternet {
		deny = append(deny, AllTraffic)
	}
	if p.Deny, err = parsePrefixes("denyOut", deny); err != nil {
		return Policy{}, err
	}
	slices.Sort(p.Domains)
	p.Domains = slices.Compact(p.Domains)
	if len(p.Domains) > MaxDomains {
		return Policy{}, fmt.Errorf("%w: allowOut names %d domains, at most %d are allowed", ErrInvalid, len(p.Domains), MaxDomains)
	}
	if p.Rules, err = compileRules(cfg.Rules); err != nil {
		return Policy{}, err
	}
	if p.Identity, err = checkIdentity(cfg.Identity, p.Rules); err != nil {
		return Policy{}, err
	}
	if cfg.EgressProxy != nil {
		up, err := checkUpstream(*cfg.EgressProxy)
		if err != nil {
			return Policy{}, err
		}
		p.Upstream = &up
	}
	return p, nil
}

// Empty reports whether the policy restricts nothing: no rules at all.
func (p Policy) Empty() bool {
	return len(p.Allow) == 0 && len(p.Deny) == 0 && len(p.Domains) == 0 && len(p.Rules) == 0 && p.Upstream == nil
}

// NeedsProxy reports whether the sandbox's TCP must pass the egress
// proxy: when a domain, a rule or an upstream proxy is named. Address
// rules alone are enforced in the kernel.
func (p Policy) NeedsProxy() bool {
	return len(p.Domains) > 0 || len(p.Rules) > 0 || p.Upstream != nil
}

// AddressVerdict is what the address rules alone say about dst: allowed
// by an allow rule, denied by a deny rule, or allowed by default.
type AddressVerdict int

const (
	AddrDefault AddressVerdict = iota // neither list names it: allowed
	AddrAllowed
	AddrDenied
)

// CheckAddress applies the address rules to dst.
func (p Policy) CheckAddress(dst netip.Addr) AddressVerdict {
	dst = dst.Unmap()
	if containsAddr(p.Allow, dst) {
		return AddrAllowed
	}
	if containsAddr(p.Deny, dst) {
		return AddrDenied
	}
	return AddrDefault
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// AllowsHost reports which allowOut domain pattern host matches, if any.
func (p Policy) AllowsHost(host string) (string, bool) {
	host = NormalizeHost(host)
	if host == "" {
		return "", false
	}
	for _, d := range p.Domains {
		if MatchHost(d, host) {
			return d, true
		}
	}
	return "", false
}

// RuleFor returns the rule of the first pattern host matches.
func (p Policy) RuleFor(host string) (HostRule, bool) {
	host = NormalizeHost(host)
	if host == "" {
		return HostRule{}, false
	}
	for _, r := range p.Rules {
		if MatchHost(r.Pattern, host) {
			return r, true
		}
	}
	return HostRule{}, false
}

// MatchHost reports whether host (normalized) matches pattern: the same
// name, "*." and any name below it (not the name itself), or "*".
func MatchHost(pattern, host string) bool {
	switch {
	case pattern == "*":
		return host != ""
	case strings.HasPrefix(pattern, "*."):
		return strings.HasSuffix(host, pattern[1:]) && len(host) > len(pattern)-1
	default:
		return pattern == host
	}
}

// NormalizeHost lower-cases a host name from an SNI or a Host header and
// strips a port and a trailing dot. An IP literal normalizes to "": it
// names no domain.
func NormalizeHost(h string) string {
	h = strings.TrimSpace(h)
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if _, err := netip.ParseAddr(h); err == nil {
		return ""
	}
	if !validHostname(h) {
		return ""
	}
	return h
}

// isAddress tells a CIDR or IP entry from a domain.
func isAddress(e string) bool {
	if _, err := netip.ParsePrefix(e); err == nil {
		return true
	}
	_, err := netip.ParseAddr(e)
	return err == nil
}

// parsePrefixes parses CIDRs and IPs (IPv4: sandboxes have no IPv6),
// masked, sorted and without duplicates.
func parsePrefixes(field string, entries []string) ([]netip.Prefix, error) {
	if len(entries) > MaxAddressEntries {
		return nil, fmt.Errorf("%w: %s has %d addresses and ranges, at most %d are allowed", ErrInvalid, field, len(entries), MaxAddressEntries)
	}
	out := make([]netip.Prefix, 0, len(entries))
	for _, e := range entries {
		e = strings.TrimSpace(e)
		var p netip.Prefix
		if a, err := netip.ParseAddr(e); err == nil {
			p = netip.PrefixFrom(a, a.BitLen())
		} else if p, err = netip.ParsePrefix(e); err != nil {
			return nil, fmt.Errorf("%w: %s entry %q is not a CIDR or an IP address", ErrInvalid, field, e)
		}
		if !p.Addr().Is4() || p.Addr().Zone() != "" {
			return nil, fmt.Errorf("%w: %s entry %q: only IPv4 is supported (sandboxes have no IPv6)", ErrInvalid, field, e)
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out), nil
}

var labelPattern = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)

func validHostname(h string) bool {
	if h == "" || len(h) > maxDomainLen {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if !labelPattern.MatchString(l) {
			return false
		}
	}
	return true
}

// normalizePattern checks a domain pattern of allowOut or rules and
// returns it lower-cased: a name, "*.name" or "*".
func normalizePattern(e string) (string, error) {
	d := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(e)), ".")
	if d == "*" {
		return d, nil
	}
	name := strings.TrimPrefix(d, "*.")
	if strings.Contains(name, "*") {
		return "", errors.New("a wildcard may only be a whole first label (*.example.com)")
	}
	if !validHostname(name) {
		return "", errors.New("not a valid host name")
	}
	return d, nil
}

// forbiddenHeaders are headers a rule may not set: they frame the
// message or the connection, and changing them would desynchronise the
// proxy and the server.
var forbiddenHeaders = map[string]bool{
	"host": true, "content-length": true, "transfer-encoding": true, "connection": true, "upgrade": true,
	"keep-alive": true, "te": true, "trailer": true, "proxy-connection": true, "expect": true,
}

func compileRules(in map[string][]Rule) ([]HostRule, error) {
	if len(in) > MaxRuleDomains {
		return nil, fmt.Errorf("%w: rules name %d domains, at most %d are allowed", ErrInvalid, len(in), MaxRuleDomains)
	}
	var out []HostRule
	for host, rules := range in {
		pattern, err := normalizePattern(host)
		if err != nil || pattern == "*" {
			return nil, fmt.Errorf("%w: rules key %q is not a domain (example.com or *.example.com)", ErrInvalid, host)
		}
		if len(rules) > MaxRulesPerDomain {
			return nil, fmt.Errorf("%w: rules for %q: at most %d rule per domain", ErrInvalid, host, MaxRulesPerDomain)
		}
		hr := HostRule{Pattern: pattern}
		secrets := map[string]bool{}
		for _, r := range rules {
			if r.Transform == nil {
				continue
			}
			if len(r.Transform.Headers) > MaxHeadersPerRule {
				return nil, fmt.Errorf("%w: rules for %q set %d headers, at most %d are allowed", ErrInvalid, host, len(r.Transform.Headers), MaxHeadersPerRule)
			}
			for name, value := range r.Transform.Headers {
				h, err := checkHeader(host, name, value)
				if err != nil {
					return nil, err
				}
				for _, s := range h.Secrets {
					secrets[s] = true
				}
				hr.Headers = append(hr.Headers, h)
			}
		}
		if len(secrets) > MaxSecretsPerRule {
			return nil, fmt.Errorf("%w: rules for %q refer to %d secrets, at most %d are allowed", ErrInvalid, host, len(secrets), MaxSecretsPerRule)
		}
		slices.SortFunc(hr.Headers, func(a, b Header) int { return strings.Compare(a.Name, b.Name) })
		out = append(out, hr)
	}
	// Exact names before wildcards, longer wildcards first: the most
	// specific pattern wins.
	slices.SortFunc(out, func(a, b HostRule) int {
		aw, bw := strings.HasPrefix(a.Pattern, "*"), strings.HasPrefix(b.Pattern, "*")
		switch {
		case aw != bw:
			if aw {
				return 1
			}
			return -1
		case len(a.Pattern) != len(b.Pattern):
			return len(b.Pattern) - len(a.Pattern)
		}
		return strings.Compare(a.Pattern, b.Pattern)
	})
	for i := 1; i < len(out); i++ {
		if out[i].Pattern == out[i-1].Pattern {
			return nil, fmt.Errorf("%w: rules name %q twice", ErrInvalid, out[i].Pattern)
		}
	}
	return out, nil
}

func checkHeader(host, name, value string) (Header, error) {
	switch {
	case name == "" || !httpguts.ValidHeaderFieldName(name):
		return Header{}, fmt.Errorf("%w: rules for %q: header name %q is not a valid HTTP header name", ErrInvalid, host, name)
	case len(name) > MaxHeaderNameLen:
		return Header{}, fmt.Errorf("%w: rules for %q: header name %q is longer than %d characters", ErrInvalid, host, name, MaxHeaderNameLen)
	case forbiddenHeaders[strings.ToLower(name)] || strings.HasPrefix(strings.ToLower(name), "proxy-"):
		return Header{}, fmt.Errorf("%w: rules for %q: header %q frames the request or the connection and cannot be set", ErrInvalid, host, name)
	case len(value) > MaxHeaderValueLen:
		return Header{}, fmt.Errorf("%w: rules for %q: the value of header %q is longer than %d characters", ErrInvalid, host, name, MaxHeaderValueLen)
	case !httpguts.ValidHeaderFieldValue(value):
		return Header{}, fmt.Errorf("%w: rules for %q: the value of header %q holds characters a header may not", ErrInvalid, host, name)
	}
	refs, err := ParsePlaceholders(value)
	if err != nil {
		return Header{}, fmt.Errorf("%w: rules for %q: header %q: %v", ErrInvalid, host, name, err)
	}
	return Header{Name: name, Value: value, Secrets: refs.Secrets, Tokens: refs.Tokens}, nil
}

// MaxIdentityTokens is the most identity tokens a sandbox may name
// (E2B's limit).
const MaxIdentityTokens = 5

// checkIdentity checks a sandbox's tokens and that every token a rule
// refers to is one of them: a name the sandbox did not ask for is
// refused, never minted.
func checkIdentity(tokens map[string]string, rules []HostRule) (map[string]string, error) {
	if len(tokens) > MaxIdentityTokens {
		return nil, fmt.Errorf("%w: iam.tokens: too many tokens: %d (max %d)", ErrInvalid, len(tokens), MaxIdentityTokens)
	}
	for name, aud := range tokens {
		if err := CheckTokenName(name); err != nil {
			return nil, fmt.Errorf("%w: iam.tokens: %q: %v", ErrInvalid, name, err)
		}
		if aud == "" || len(aud) > MaxAudience || !utf8.ValidString(aud) {
			return nil, fmt.Errorf("%w: iam.tokens.%s.audience: an audience has 1 to %d characters", ErrInvalid, name, MaxAudience)
		}
	}
	for _, r := range rules {
		for _, h := range r.Headers {
			for _, t := range h.Tokens {
				if _, ok := tokens[t]; !ok {
					return nil, fmt.Errorf("%w: rules for %q: header %q refers to ${e2b.identity.tokens.%s}, which is not in the sandbox's iam.tokens", ErrInvalid, r.Pattern, h.Name, t)
				}
			}
		}
	}
	if len(tokens) == 0 {
		return nil, nil
	}
	return maps.Clone(tokens), nil
}

// MaxAudience bounds an identity token's audience.
const MaxAudience = 512

// checkUpstream checks an egressProxy's syntax; whether its address may
// be reached is decided where it is dialled.
func checkUpstream(u UpstreamProxy) (UpstreamProxy, error) {
	proto, hostPort := u.Endpoint()
	if proto == "" {
		return u, fmt.Errorf("%w: egressProxy.address %q: a SOCKS5 proxy is host:port (or socks5://host:port), an HTTP CONNECT proxy http://host:port; no other scheme is supported", ErrInvalid, u.Address)
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return u, fmt.Errorf("%w: egressProxy.address %q is not host:port", ErrInvalid, u.Address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return u, fmt.Errorf("%w: egressProxy.address %q: the port must be 1-65535", ErrInvalid, u.Address)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return u, fmt.Errorf("%w: egressProxy.address %q: only IPv4 is supported", ErrInvalid, u.Address)
		}
	} else if !validHostname(strings.ToLower(host)) {
		return u, fmt.Errorf("%w: egressProxy.address %q: %q is not a host name or an IPv4 address", ErrInvalid, u.Address, host)
	}
	if len(u.Username) > maxProxyCredential || len(u.Password) > maxProxyCredential {
		return u, fmt.Errorf("%w: egressProxy username and password are at most %d bytes", ErrInvalid, maxProxyCredential)
	}
	if u.Password != "" && u.Username == "" {
		return u, fmt.Errorf("%w: egressProxy.password needs a username", ErrInvalid)
	}
	// RFC 1929 carries any bytes; Basic credentials cannot hold a ':' in
	// the user name, and no header may hold a line break.
	if proto == ProtocolConnect && (strings.ContainsAny(u.Username, ":\r\n\x00") || strings.ContainsAny(u.Password, "\r\n\x00")) {
		return u, fmt.Errorf("%w: egressProxy username or password holds a character an HTTP CONNECT proxy's may not (':' in the username, line breaks)", ErrInvalid)
	}
	canonical := net.JoinHostPort(strings.ToLower(host), port)
	if scheme, _, ok := strings.Cut(strings.TrimSpace(u.Address), "://"); ok {
		canonical = strings.ToLower(scheme) + "://" + canonical
	}
	u.Address = canonical
	return u, nil
}
