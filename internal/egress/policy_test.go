package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestCompile(t *testing.T) {
	p, err := Compile(Config{
		AllowOut: []string{"198.18.0.0/15", "203.0.113.7", "API.Example.com", "*.example.org.", "*"},
		DenyOut:  []string{"192.0.2.0/24"},
		Rules: map[string][]Rule{"api.example.com": {{Transform: &Transform{Headers: map[string]string{
			"Authorization": "Bearer ${e2b.secrets.OpenAI-Key}", "X-Plain": "${not-ours}",
		}}}}},
		EgressProxy: &UpstreamProxy{Address: "Proxy.Example.net:3128", Username: "u", Password: "p"},
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(p.Allow, p.Deny, p.Domains); got != "[198.18.0.0/15 203.0.113.7/32] [0.0.0.0/0 192.0.2.0/24] [* *.example.org api.example.com]" {
		t.Errorf("compiled: %s", got)
	}
	if len(p.Rules) != 1 || len(p.Rules[0].Headers) != 2 || fmt.Sprint(p.Rules[0].Headers[0].Secrets) != "[openai-key]" {
		t.Errorf("rules: %+v", p.Rules)
	}
	if p.Upstream.Address != "proxy.example.net:3128" || !p.NeedsProxy() {
		t.Errorf("upstream: %+v", p.Upstream)
	}
	if p := mustCompile(t, Config{EgressProxy: &UpstreamProxy{Address: " HTTP://Proxy.Example.net:3128"}}, true); p.Upstream.Address != "http://proxy.example.net:3128" {
		t.Errorf("a CONNECT proxy's address: %q", p.Upstream.Address)
	} else if proto, hp := p.Upstream.Endpoint(); proto != ProtocolConnect || hp != "proxy.example.net:3128" {
		t.Errorf("a CONNECT proxy's endpoint: %s %s", proto, hp)
	}
	if proto, _ := p.Upstream.Endpoint(); proto != ProtocolSOCKS5 {
		t.Errorf("a bare host:port is %s; want SOCKS5, as in E2B", proto)
	}
	if p, _ := Compile(Config{AllowOut: []string{"10.0.0.0/8"}}, true); p.NeedsProxy() || p.Empty() {
		t.Error("an address-only policy needs the proxy, or is empty")
	}
	if p, _ := Compile(Config{}, true); !p.Empty() {
		t.Error("an empty config compiled to a non-empty policy")
	}

	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{DenyOut: []string{"example.com"}}, `denyOut entry "example.com"`},
		{Config{AllowOut: []string{"2001:db8::/32"}}, "only IPv4"},
		{Config{DenyOut: []string{"::1"}}, "only IPv4"},
		{Config{AllowOut: []string{"exa*mple.com"}}, "wildcard"},
		{Config{AllowOut: []string{"*.com."}}, ""},
		{Config{AllowOut: []string{"*.com", "a b"}}, `"a b"`},
		{Config{AllowOut: []string{"10.0.0.0/33"}}, "10.0.0.0/33"},
		{Config{Rules: map[string][]Rule{"*": nil}}, "not a domain"},
		{Config{Rules: map[string][]Rule{"a.com": {{}, {}}}}, "at most 1"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"Host": "x"}}}}}}, "cannot be set"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"Transfer-Encoding": "x"}}}}}}, "cannot be set"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X bad": "x"}}}}}}, "not a valid HTTP header name"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "a\r\nX-Evil: 1"}}}}}}, "characters"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.secrets.x"}}}}}}, "not closed"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.identity.tokens.aws}"}}}}}}, "not in the sandbox's iam.tokens"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.identity.tokens.aws}"}}}}}, Identity: map[string]string{"gcp": "x"}}, "not in the sandbox's iam.tokens"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.identity.tokens.aws}"}}}}}, Identity: map[string]string{"aws": "sts.amazonaws.com"}}, ""},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.identity.tokens.a${e2b.secrets.x}}"}}}}}, Identity: map[string]string{"a": "x"}}, "'{'"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.identity.tokens.}"}}}}}}, "1 to"},
		{Config{Identity: map[string]string{"a": ""}}, "audience"},
		{Config{Identity: map[string]string{"a{": "x"}}, "'{'"},
		{Config{Identity: map[string]string{"a": "1", "b": "1", "c": "1", "d": "1", "e": "1", "f": "1"}}, "too many tokens"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.identity.aws}"}}}}}}, "not supported"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.secrets.sec_1}"}}}}}}, "sec_"},
		{Config{Rules: map[string][]Rule{"a.com": {{Transform: &Transform{Headers: map[string]string{"X-A": "${e2b.secrets.a/b}"}}}}}}, "letters"},
		{Config{EgressProxy: &UpstreamProxy{Address: "proxy"}}, "host:port"},
		{Config{EgressProxy: &UpstreamProxy{Address: "proxy:0"}}, "1-65535"},
		{Config{EgressProxy: &UpstreamProxy{Address: "[::1]:80"}}, "only IPv4"},
		{Config{EgressProxy: &UpstreamProxy{Address: "p:80", Password: "x"}}, "needs a username"},
		{Config{EgressProxy: &UpstreamProxy{Address: "http://p:80", Username: "a:b"}}, "character"},
		{Config{EgressProxy: &UpstreamProxy{Address: "http://p:80", Username: "a", Password: "b\r\nX: y"}}, "character"},
		{Config{EgressProxy: &UpstreamProxy{Address: "p:80", Username: "a:b", Password: "any\x00bytes:"}}, ""}, // RFC 1929 carries any bytes
		{Config{EgressProxy: &UpstreamProxy{Address: "socks5://p:80"}}, ""},
		{Config{EgressProxy: &UpstreamProxy{Address: "https://p:443"}}, "no other scheme"},
		{Config{EgressProxy: &UpstreamProxy{Address: "socks4://p:1080"}}, "no other scheme"},
		{Config{EgressProxy: &UpstreamProxy{Address: "http://p:80/path"}}, "1-65535"},
		{Config{EgressProxy: &UpstreamProxy{Address: "p:80", Username: strings.Repeat("u", 256)}}, "at most 255"},
	} {
		_, err := Compile(c.cfg, true)
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", c.cfg, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want an ErrInvalid saying %q", c.cfg, err, c.want)
		}
	}
	many := make([]string, MaxAddressEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	if _, err := Compile(Config{AllowOut: many}, true); !errors.Is(err, ErrInvalid) {
		t.Errorf("too many entries: %v", err)
	}
}

func TestJudge(t *testing.T) {
	p, err := Compile(Config{AllowOut: []string{"198.18.0.0/24", "*.example.com", "exact.org"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dst, host string
		allow     bool
		rule      string
		domain    bool
	}{
		{"198.18.0.5:443", "", true, "allowOut 198.18.0.0/24", false},
		{"198.18.0.5:443", "evil.net", true, "allowOut 198.18.0.0/24", false},
		{"198.18.9.9:443", "api.example.com", true, "allowOut *.example.com", true},
		{"198.18.9.9:8443", "a.b.example.com", true, "allowOut *.example.com", true},
		{"198.18.9.9:443", "example.com", false, "denyOut 0.0.0.0/0", false},
		{"198.18.9.9:443", "exact.org", true, "allowOut exact.org", true},
		{"198.18.9.9:443", "sub.exact.org", false, "denyOut 0.0.0.0/0", false},
		{"198.18.9.9:443", "", false, "denyOut 0.0.0.0/0", false},
		{"198.18.9.9:443", "evil-example.com", false, "denyOut 0.0.0.0/0", false},
	} {
		v := judge(p, netip.MustParseAddrPort(c.dst), NormalizeHost(c.host))
		if v.allow != c.allow || v.rule != c.rule || v.domain != c.domain {
			t.Errorf("%s %q: %+v; want allow=%v rule=%q domain=%v", c.dst, c.host, v, c.allow, c.rule, c.domain)
		}
	}
}

func TestNormalizeHost(t *testing.T) {
	for in, want := range map[string]string{
		"Api.Example.COM.": "api.example.com", "api.example.com:8443": "api.example.com", "198.18.0.1": "",
		"198.18.0.1:80": "", "[::1]:443": "", "": "", "a..b": "", "bad host": "", "x_y.example": "x_y.example",
	} {
		if got := NormalizeHost(in); got != want {
			t.Errorf("NormalizeHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPlaceholders(t *testing.T) {
	secret := func(n string) (string, error) {
		if n != "tok" {
			return "", fmt.Errorf("unknown %s", n)
		}
		return "v", nil
	}
	token := func(n string) (string, error) { return "<" + n + ">", nil }
	got, err := ExpandPlaceholders("Bearer ${e2b.secrets.Tok} ${e2b.secrets.tok}-${x} ${e2b.identity.tokens.AWS}", secret, token)
	if err != nil || got != "Bearer v v-${x} <AWS>" {
		t.Errorf("%q, %v", got, err)
	}
	refs, err := ParsePlaceholders("${e2b.identity.tokens.a}${e2b.secrets.S}${e2b.identity.tokens.a}${e2b.identity.tokens.A}")
	if err != nil || fmt.Sprint(refs) != "{[s] [a A]}" {
		t.Errorf("refs %v %v", refs, err)
	}
}

func FuzzCompile(f *testing.F) {
	for _, s := range []string{"198.18.0.0/15", "*.example.com", "::1", "*", "a.*.b", "${e2b.secrets.x}", "${e2b.", "example.com:443", "0.0.0.0/0"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, entry, header string) {
		p, err := Compile(Config{
			AllowOut: []string{entry}, DenyOut: []string{entry},
			Rules: map[string][]Rule{entry: {{Transform: &Transform{Headers: map[string]string{"X-A": header}}}}},
		}, false)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("an error that is not ErrInvalid: %v", err)
			}
			return
		}
		for _, d := range p.Domains {
			if strings.ContainsAny(d, " \r\n/") {
				t.Fatalf("domain %q compiled", d)
			}
		}
		_ = judge(p, netip.MustParseAddrPort("198.18.0.1:443"), NormalizeHost(entry))
	})
}
