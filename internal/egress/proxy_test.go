package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// These tests run the proxy on loopback, without root: "sandboxes" dial
// it from 127.0.0.1, a fake OriginalDst says where each connection was
// going, and the upstream servers listen on other 127/8 addresses.

type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

type testProxy struct {
	t     *testing.T
	p     *Proxy
	addr  string
	dsts  sync.Map // client port → netip.AddrPort
	audit *Audit
	ca    *CA
	// minted counts the identity tokens the fake minter made.
	minted atomic.Int64
}

var refusedInTests = netip.MustParseAddr("127.0.0.9") // stands for an address the node refuses

func newTestProxy(t *testing.T, names fakeResolver, roots *x509.CertPool, secrets map[string]string) *testProxy {
	t.Helper()
	tp := &testProxy{t: t}
	var err error
	if tp.ca, err = LoadCA(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if tp.audit, err = OpenAudit(t.TempDir(), 0, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.audit.Close)
	tp.p, err = NewProxy(ProxyConfig{
		Refused:  func(a netip.Addr) bool { return a == refusedInTests },
		Resolver: names, CA: tp.ca, RootCAs: roots, Audit: tp.audit,
		SniffTimeout: time.Hour, // a test that relied on it would hang, not pass
		Secrets: func(_ context.Context, team, name string) (string, error) {
			if v, ok := secrets[team+"/"+name]; ok {
				return v, nil
			}
			return "", errors.New("no such secret")
		},
		Identity: func(team, sandbox, audience string) (string, error) {
			return fmt.Sprintf("svid(%s,%s,%s,%d)", team, sandbox, audience, tp.minted.Add(1)), nil
		},
		OriginalDst: func(c net.Conn) (netip.AddrPort, error) {
			port := c.RemoteAddr().(*net.TCPAddr).Port
			for range 200 {
				if v, ok := tp.dsts.Load(port); ok {
					return v.(netip.AddrPort), nil
				}
				time.Sleep(10 * time.Millisecond)
			}
			return netip.AddrPort{}, errors.New("no original destination")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp.addr = ln.Addr().String()
	go tp.p.Serve(ln)
	t.Cleanup(func() { tp.p.Close() })
	return tp
}

func (tp *testProxy) register(p Policy) {
	tp.p.Register(netip.MustParseAddr("127.0.0.1"), Sandbox{ID: "sbx1", TeamID: "team1", Policy: p})
}

// dial opens a "sandbox" connection to dst through the proxy.
func (tp *testProxy) dial(dst netip.AddrPort) (net.Conn, error) {
	c, err := net.Dial("tcp4", tp.addr)
	if err != nil {
		return nil, err
	}
	tp.dsts.Store(c.LocalAddr().(*net.TCPAddr).Port, dst)
	return c, nil
}

func (tp *testProxy) client(dst netip.AddrPort, tlsCfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:       func(context.Context, string, string) (net.Conn, error) { return tp.dial(dst) },
		TLSClientConfig:   tlsCfg,
		DisableKeepAlives: true,
	}}
}

func (tp *testProxy) entries() []Entry {
	tp.audit.Flush()
	es, err := tp.audit.Read("sbx1", time.Time{}, 0)
	if err != nil {
		tp.t.Fatal(err)
	}
	return es
}

func mustCompile(t *testing.T, cfg Config, internet bool) Policy {
	t.Helper()
	p, err := Compile(cfg, internet)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// echoServer answers every HTTP request with its name and the request's
// headers, one per line, sorted.
type echoServer struct {
	name     string
	addr     netip.AddrPort
	requests atomic.Int64
}

func (s *echoServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	var lines []string
	for k, v := range r.Header {
		lines = append(lines, k+": "+strings.Join(v, ","))
	}
	sort.Strings(lines)
	fmt.Fprintf(w, "server=%s host=%s\n%s\n", s.name, r.Host, strings.Join(lines, "\n"))
}

// listenOn listens on ip with port (0: any).
func listenOn(t *testing.T, ip string, port int) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp4", fmt.Sprintf("%s:%d", ip, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serveEach hands each connection ln accepts to handle, in a goroutine of
// its own, until ln is closed.
func serveEach(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

func serveEcho(t *testing.T, name string, ln net.Listener, cert *tls.Certificate) *echoServer {
	t.Helper()
	s := &echoServer{name: name, addr: netip.MustParseAddrPort(ln.Addr().String())}
	srv := &http.Server{Handler: s}
	if cert != nil {
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*cert}}
		go srv.ServeTLS(ln, "", "")
	} else {
		go srv.Serve(ln)
	}
	t.Cleanup(func() { srv.Close() })
	return s
}

// twinServers listen on the same port of 127.0.0.2 ("real") and
// 127.0.0.3 ("evil"), so that a connection can be sent to the wrong one.
func twinServers(t *testing.T, cert *tls.Certificate) (real, evil *echoServer) {
	t.Helper()
	for range 20 {
		a := listenOn(t, "127.0.0.2", 0)
		port := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.3:%d", port))
		if err != nil {
			a.Close()
			continue
		}
		t.Cleanup(func() { b.Close() })
		return serveEcho(t, "real", a, cert), serveEcho(t, "evil", b, cert)
	}
	t.Fatal("no port free on both 127.0.0.2 and 127.0.0.3")
	return nil, nil
}

// selfSigned makes a certificate for names and a pool trusting it.
func selfSigned(t *testing.T, names ...string) (*tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func get(c *http.Client, url string) (string, error) {
	res, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("status %s: %s", res.Status, b)
	}
	return string(b), err
}

// mustBeReset wants the exchange refused with a reset (or a close before
// any answer), never an answer.
func mustBeReset(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: got an answer; want the connection refused", what)
		return
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "connection reset") && !strings.Contains(err.Error(), "EOF") {
		t.Errorf("%s: %v; want the connection reset", what, err)
	}
}

func TestProxyDomainsByHostAndSNI(t *testing.T) {
	cert, pool := selfSigned(t, "api.example.test", "other.test")
	real, evil := twinServers(t, nil)
	realTLS, evilTLS := twinServers(t, cert)
	names := fakeResolver{"api.example.test": {real.addr.Addr()}, "evil.test": {evil.addr.Addr()}}
	tp := newTestProxy(t, names, nil, nil)
	tp.register(mustCompile(t, Config{AllowOut: []string{"*.example.test"}}, false))

	// HTTP Host and TLS SNI of an allowed name, to the name's address.
	if got, err := get(tp.client(real.addr, nil), "http://api.example.test:"+fmt.Sprint(real.addr.Port())+"/"); err != nil || !strings.HasPrefix(got, "server=real") {
		t.Errorf("allowed Host: %q, %v", got, err)
	}
	tlsCfg := &tls.Config{RootCAs: pool, ServerName: "api.example.test"}
	if got, err := get(tp.client(realTLS.addr, tlsCfg), "https://api.example.test/"); err != nil || !strings.HasPrefix(got, "server=real") {
		t.Errorf("allowed SNI: %q, %v", got, err)
	}
	// The bare IP, a name not allowed, and no name at all are refused.
	_, err := get(tp.client(real.addr, nil), "http://"+real.addr.String()+"/")
	mustBeReset(t, "the bare IP", err)
	_, err = get(tp.client(evil.addr, nil), "http://evil.test/")
	mustBeReset(t, "a name not allowed", err)
	c, err := tp.dial(real.addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("\x00\x01binary"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 10))
	mustBeReset(t, "neither TLS nor HTTP", err)
	c.Close()

	// An allowed name sent to another address goes to the name's address
	// instead (SNI/Host mismatch, /etc/hosts tricks).
	before := evil.requests.Load()
	if got, err := get(tp.client(evil.addr, nil), "http://api.example.test/"); err != nil || !strings.HasPrefix(got, "server=real") {
		t.Errorf("allowed Host sent to another address: %q, %v; want it at the name's address", got, err)
	}
	if evil.requests.Load() != before {
		t.Error("the address the sandbox dialled got the request")
	}
	tlsCfg = &tls.Config{RootCAs: pool, ServerName: "api.example.test"}
	if got, err := get(tp.client(evilTLS.addr, tlsCfg), "https://api.example.test/"); err != nil || !strings.HasPrefix(got, "server=real") {
		t.Errorf("allowed SNI sent to another address: %q, %v", got, err)
	}
	// A name that resolves only to a refused address is refused.
	names["private.example.test"] = []netip.Addr{refusedInTests}
	_, err = get(tp.client(real.addr, nil), "http://private.example.test/")
	mustBeReset(t, "a name resolving to a refused address", err)

	var allowed, denied int
	for _, e := range tp.entries() {
		switch e.Decision {
		case Allow:
			allowed++
		case Deny:
			denied++
		}
		if e.Sandbox != "sbx1" || e.Dst == "" || e.Rule == "" {
			t.Errorf("audit entry %+v", e)
		}
	}
	if allowed != 4 || denied != 4 {
		t.Errorf("audit: %d allowed, %d denied; want 4 and 4", allowed, denied)
	}
}

// recordingServer accepts TCP connections, keeps what each sent, and
// answers every request it reads with a small HTTP response.
type recordingServer struct {
	addr     netip.AddrPort
	accepted atomic.Int64
	mu       sync.Mutex
	received []string // per connection, in order of acceptance
}

func serveRecording(t *testing.T, ln net.Listener) *recordingServer {
	s := &recordingServer{addr: netip.MustParseAddrPort(ln.Addr().String())}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			i := len(s.received)
			s.received = append(s.received, "")
			s.mu.Unlock()
			s.accepted.Add(1)
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(r)
					if err != nil {
						return
					}
					s.mu.Lock()
					s.received[i] += req.Host + " "
					s.mu.Unlock()
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	return s
}

func (s *recordingServer) hosts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.received)
}

// waitAccepted waits up to d for the server to have accepted n connections.
func (s *recordingServer) waitAccepted(n int64, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if s.accepted.Load() >= n {
			return true
		}
	}
	return s.accepted.Load() >= n
}

// The proxy dials ahead (before it has read a name) only an address that
// an allowed name resolved to, and sends nothing on that connection when
// the name it then reads is not allowed.
func TestProxyDialsAheadOnlyAnAllowedNamesAddress(t *testing.T) {
	var real, other *recordingServer
	for range 20 {
		a := listenOn(t, "127.0.0.2", 0)
		b, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.3:%d", a.Addr().(*net.TCPAddr).Port))
		if err != nil {
			a.Close()
			continue
		}
		t.Cleanup(func() { b.Close() })
		real, other = serveRecording(t, a), serveRecording(t, b)
		break
	}
	if real == nil {
		t.Fatal("no port free on both 127.0.0.2 and 127.0.0.3")
	}
	names := fakeResolver{"api.example.test": {real.addr.Addr()}, "cdn.other.test": {real.addr.Addr()}}
	tp := newTestProxy(t, names, nil, nil)
	tp.register(mustCompile(t, Config{AllowOut: []string{"api.example.test"}}, false))
	request := func(dst netip.AddrPort, host string) error {
		c, err := tp.dial(dst)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		res.Body.Close()
		return nil
	}
	// Nothing resolved yet: the first connection is dialled after its
	// name is read (to the name's address, not the one dialled).
	if err := request(other.addr, "api.example.test"); err != nil {
		t.Fatalf("allowed name: %v", err)
	}
	if real.accepted.Load() != 1 || other.accepted.Load() != 0 {
		t.Fatalf("accepted: real %d, other %d; want 1 and 0", real.accepted.Load(), other.accepted.Load())
	}
	// Now the name's address is known: a connection to it is dialled
	// before the client sends a byte...
	c, err := tp.dial(real.addr)
	if err != nil {
		t.Fatal(err)
	}
	if !real.waitAccepted(2, 5*time.Second) {
		t.Fatal("the proxy did not dial ahead an address the allowed name resolved to")
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
	if res, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || res.StatusCode != 200 {
		t.Fatalf("allowed name on the connection dialled ahead: %v", err)
	}
	c.Close()
	if n := real.accepted.Load(); n != 2 {
		t.Fatalf("real accepted %d connections; want 2 (the one dialled ahead was used)", n)
	}
	// ...but one to an address no allowed name resolved to is not.
	c, err = tp.dial(other.addr)
	if err != nil {
		t.Fatal(err)
	}
	if other.waitAccepted(1, 300*time.Millisecond) {
		t.Error("the proxy dialled ahead an address no allowed name resolved to")
	}
	c.Close()
	// A name that is not allowed, sent to the allowed name's address: the
	// connection dialled ahead carries nothing and the client is reset.
	err = request(real.addr, "evil.test")
	mustBeReset(t, "a name not allowed at an allowed name's address", err)
	// A name that resolved to the same address but is not allowed opens
	// nothing ahead either once the policy names another host.
	if err := request(real.addr, "api.example.test"); err != nil {
		t.Fatalf("allowed name: %v", err)
	}
	tp.register(mustCompile(t, Config{AllowOut: []string{"cdn.other.test"}}, false))
	_ = request(other.addr, "cdn.other.test") // resolves cdn.other.test: the cache now knows both names at real's address
	tp.register(mustCompile(t, Config{AllowOut: []string{"www.example.test"}}, false))
	before := real.accepted.Load()
	c, err = tp.dial(real.addr)
	if err != nil {
		t.Fatal(err)
	}
	if real.waitAccepted(before+1, 300*time.Millisecond) {
		t.Error("the proxy dialled ahead an address whose names the policy does not allow")
	}
	c.Close()
	for i, h := range real.hosts() {
		if strings.Contains(h, "evil.test") {
			t.Errorf("connection %d to the allowed name's address carried %q", i, h)
		}
	}
	if h := other.hosts(); len(h) != 0 {
		t.Errorf("the address no allowed name resolved to got connections: %q", h)
	}
}

func TestProxyAddressRulesAndServerFirst(t *testing.T) {
	banner := listenOn(t, "127.0.0.2", 0)
	go func() {
		for {
			c, err := banner.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SSH-2.0-test\r\n"))
			io.Copy(c, c)
			c.Close()
		}
	}()
	dst := netip.MustParseAddrPort(banner.Addr().String())
	tp := newTestProxy(t, fakeResolver{}, nil, nil)
	tp.register(mustCompile(t, Config{AllowOut: []string{"127.0.0.2", "*.example.test"}, DenyOut: []string{"127.0.0.0/8"}}, true))
	c, err := tp.dial(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "SSH-2.0-test\r\n" {
		t.Fatalf("server-first banner through the proxy: %q, %v", line, err)
	}
	// Denied by address, with no name that could allow it: refused before
	// a byte is read.
	tp.register(mustCompile(t, Config{AllowOut: []string{"127.0.0.2"}, DenyOut: []string{"127.0.0.0/8"}}, true))
	c2, err := tp.dial(netip.MustParseAddrPort("127.0.0.5:22"))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = c2.Read(make([]byte, 1))
	mustBeReset(t, "a denied address", err)
	// The node's refusal wins over any allow.
	tp.register(mustCompile(t, Config{AllowOut: []string{"0.0.0.0/0"}}, true))
	c3, err := tp.dial(netip.AddrPortFrom(refusedInTests, 80))
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	_ = c3.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = c3.Read(make([]byte, 1))
	mustBeReset(t, "an address the node refuses", err)
}

func TestProxyRulesInjectSecrets(t *testing.T) {
	cert, pool := selfSigned(t, "api.example.test")
	realTLS, evilTLS := twinServers(t, cert)
	real, _ := twinServers(t, nil)
	names := fakeResolver{"api.example.test": {realTLS.addr.Addr()}}
	secrets := map[string]string{"team1/token": "s3cret-value"}
	tp := newTestProxy(t, names, pool, secrets)
	tp.register(mustCompile(t, Config{
		AllowOut: []string{"api.example.test"},
		Rules: map[string][]Rule{"api.example.test": {{Transform: &Transform{Headers: map[string]string{
			"Authorization": "Bearer ${e2b.secrets.TOKEN}", "X-Static": "yes",
		}}}}},
	}, false))
	caPool := x509.NewCertPool()
	caPool.AppendCertsFromPEM(tp.ca.CertPEM())

	// Over HTTPS: the sandbox trusts the node's CA, the proxy verifies
	// the real host and sets the headers (replacing the sandbox's own).
	req, _ := http.NewRequest(http.MethodGet, "https://api.example.test/", nil)
	req.Header.Set("Authorization", "Bearer from-the-sandbox")
	res, err := tp.client(realTLS.addr, &tls.Config{RootCAs: caPool}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), "Authorization: Bearer s3cret-value\n") || !strings.Contains(string(body), "X-Static: yes") || !strings.HasPrefix(string(body), "server=real") {
		t.Errorf("HTTPS with a rule: %s", body)
	}
	// Over plain HTTP on another port.
	if got, err := get(tp.client(real.addr, nil), "http://api.example.test:"+fmt.Sprint(real.addr.Port())+"/"); err != nil || !strings.Contains(got, "Authorization: Bearer s3cret-value") {
		t.Errorf("HTTP with a rule: %q, %v", got, err)
	}
	// Sent to another address, it still reaches only the real host.
	if got, err := get(tp.client(evilTLS.addr, &tls.Config{RootCAs: caPool}), "https://api.example.test/"); err != nil || !strings.HasPrefix(got, "server=real") {
		t.Errorf("rule host dialled at another address: %q, %v", got, err)
	}
	if evilTLS.requests.Load() != 0 {
		t.Error("the other address got a request")
	}
	for _, e := range tp.entries() {
		if strings.Contains(fmt.Sprint(e), "s3cret") {
			t.Errorf("the audit holds the secret: %+v", e)
		}
	}
}

// ${e2b.identity.tokens.NAME} becomes a token minted for this request,
// for the sandbox the connection is from and the audience its iam.tokens
// gave NAME; a name it did not ask for is never minted nor sent as text.
func TestProxyRulesMintIdentityTokens(t *testing.T) {
	cert, pool := selfSigned(t, "api.example.test")
	realTLS, _ := twinServers(t, cert)
	tp := newTestProxy(t, fakeResolver{"api.example.test": {realTLS.addr.Addr()}}, pool, nil)
	tp.register(mustCompile(t, Config{
		Rules: map[string][]Rule{"api.example.test": {{Transform: &Transform{Headers: map[string]string{
			"Authorization": "Bearer ${e2b.identity.tokens.aws}",
		}}}}},
		Identity: map[string]string{"aws": "sts.amazonaws.com", "unused": "x"},
	}, true))
	caPool := x509.NewCertPool()
	caPool.AppendCertsFromPEM(tp.ca.CertPEM())
	c := tp.client(realTLS.addr, &tls.Config{RootCAs: caPool})
	for i := 1; i <= 2; i++ {
		got, err := get(c, "https://api.example.test/")
		want := fmt.Sprintf("Authorization: Bearer svid(team1,sbx1,sts.amazonaws.com,%d)\n", i)
		if err != nil || !strings.Contains(got, want) {
			t.Errorf("request %d: %q %v, want %q", i, got, err, want)
		}
	}
	for _, e := range tp.entries() {
		if strings.Contains(fmt.Sprint(e), "svid(") {
			t.Errorf("the audit holds a token: %+v", e)
		}
	}

	// A policy that refers to a token the sandbox did not ask for
	// (Compile refuses one; the proxy holds without it).
	p := mustCompile(t, Config{Rules: map[string][]Rule{"api.example.test": {{Transform: &Transform{Headers: map[string]string{"X-T": "${e2b.identity.tokens.gcp}"}}}}},
		Identity: map[string]string{"gcp": "aud"}}, true)
	p.Identity = map[string]string{"aws": "sts.amazonaws.com"}
	tp.register(p)
	before := realTLS.requests.Load()
	got, err := get(c, "https://api.example.test/")
	if err == nil && !strings.Contains(got, "not one of the sandbox's iam.tokens") || strings.Contains(got, "svid(") {
		t.Errorf("an unrequested token: %q %v", got, err)
	}
	if realTLS.requests.Load() != before {
		t.Error("the host got a request with an unrequested token's placeholder")
	}
	if n := tp.minted.Load(); n != 2 {
		t.Errorf("%d tokens minted, want 2", n)
	}
}

// A real host whose certificate does not verify gets nothing.
func TestProxyRulesVerifyTheRealHost(t *testing.T) {
	cert, _ := selfSigned(t, "api.example.test") // not in the proxy's roots
	realTLS, _ := twinServers(t, cert)
	tp := newTestProxy(t, fakeResolver{"api.example.test": {realTLS.addr.Addr()}}, x509.NewCertPool(), map[string]string{"team1/token": "s3cret"})
	tp.register(mustCompile(t, Config{Rules: map[string][]Rule{"api.example.test": {{Transform: &Transform{Headers: map[string]string{"X-K": "${e2b.secrets.token}"}}}}}}, true))
	caPool := x509.NewCertPool()
	caPool.AppendCertsFromPEM(tp.ca.CertPEM())
	_, err := get(tp.client(realTLS.addr, &tls.Config{RootCAs: caPool}), "https://api.example.test/")
	mustBeReset(t, "a host whose certificate does not verify", err)
	if realTLS.requests.Load() != 0 {
		t.Error("the unverified host got a request")
	}
}

// Hostile requests on an intercepted connection: another Host on the
// same connection, an absolute URL to another host, an unknown secret.
func TestProxyRulesSmuggling(t *testing.T) {
	real, evil := twinServers(t, nil)
	names := fakeResolver{"api.example.test": {real.addr.Addr()}, "evil.test": {evil.addr.Addr()}}
	tp := newTestProxy(t, names, nil, map[string]string{"team1/token": "s3cret"})
	tp.register(mustCompile(t, Config{Rules: map[string][]Rule{
		"api.example.test": {{Transform: &Transform{Headers: map[string]string{"X-K": "${e2b.secrets.token}"}}}},
		"other.test":       {{Transform: &Transform{Headers: map[string]string{"X-K": "${e2b.secrets.missing}"}}}},
	}}, true))
	for second, refused := range map[string]bool{
		"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n":                        true,
		"GET http://evil.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n": true,
		// Go keeps the first Host and the proxy sends only that one.
		"GET / HTTP/1.1\r\nHost: api.example.test\r\nHost: evil.test\r\n\r\n": false,
	} {
		c, err := tp.dial(real.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n%s", second)
		all, _ := io.ReadAll(c)
		c.Close()
		if evil.requests.Load() != 0 || strings.Contains(string(all), "server=evil") || strings.Contains(string(all), "host=evil") {
			t.Errorf("second request %q reached evil.test: %q", second, all)
		}
		if refused != strings.Contains(string(all), " 421 ") || (refused && strings.Count(string(all), "X-K: s3cret") != 1) {
			t.Errorf("second request %q: got %q; want it refused (421): %v", second, all, refused)
		}
	}
	// An unknown secret: 502, naming the secret but no value.
	names["other.test"] = []netip.Addr{real.addr.Addr()}
	got, err := get(tp.client(real.addr, nil), "http://other.test/")
	if err == nil || !strings.Contains(err.Error(), "502") || strings.Contains(got, "s3cret") {
		t.Errorf("unknown secret: %q, %v", got, err)
	}
}

// connectProxy is an HTTP CONNECT proxy that wants user:pass.
func connectProxy(t *testing.T, ip string) (netip.AddrPort, *atomic.Int64) {
	ln := listenOn(t, ip, 0)
	var tunnels atomic.Int64
	serveEach(ln, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil || req.Method != http.MethodConnect {
			return
		}
		if req.Header.Get("Proxy-Authorization") != "Basic "+base64.StdEncoding.EncodeToString([]byte("user:pass")) {
			fmt.Fprint(c, "HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
			return
		}
		up, err := net.Dial("tcp4", req.Host)
		if err != nil {
			fmt.Fprint(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
			return
		}
		tunnels.Add(1)
		fmt.Fprint(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		go io.Copy(up, br)
		io.Copy(c, up)
		up.Close()
	})
	return netip.MustParseAddrPort(ln.Addr().String()), &tunnels
}

func TestProxyUpstreamConnect(t *testing.T) {
	real, _ := twinServers(t, nil)
	up, tunnels := connectProxy(t, "127.0.0.4")
	tp := newTestProxy(t, fakeResolver{}, nil, nil)
	tp.register(mustCompile(t, Config{EgressProxy: &UpstreamProxy{Address: "http://" + up.String(), Username: "user", Password: "pass"}}, true))
	if got, err := get(tp.client(real.addr, nil), "http://"+real.addr.String()+"/"); err != nil || !strings.HasPrefix(got, "server=real") {
		t.Errorf("through the CONNECT proxy: %q, %v", got, err)
	}
	if tunnels.Load() != 1 {
		t.Errorf("the CONNECT proxy opened %d tunnels, want 1", tunnels.Load())
	}
	// Wrong credentials, and a proxy at an address the node refuses:
	// refused, never sent directly.
	tp.register(mustCompile(t, Config{EgressProxy: &UpstreamProxy{Address: "http://" + up.String(), Username: "user", Password: "wrong"}}, true))
	_, err := get(tp.client(real.addr, nil), "http://"+real.addr.String()+"/")
	mustBeReset(t, "a CONNECT proxy refusing the credentials", err)
	tp.register(mustCompile(t, Config{EgressProxy: &UpstreamProxy{Address: "http://" + netip.AddrPortFrom(refusedInTests, up.Port()).String()}}, true))
	_, err = get(tp.client(real.addr, nil), "http://"+real.addr.String()+"/")
	mustBeReset(t, "a CONNECT proxy at a refused address", err)
	if real.requests.Load() != 1 {
		t.Errorf("the server got %d requests, want 1", real.requests.Load())
	}
}

// A new policy cuts the open connections it forbids, and only those.
func TestProxyPolicyUpdateCutsConnections(t *testing.T) {
	real, _ := twinServers(t, nil)
	names := fakeResolver{"api.example.test": {real.addr.Addr()}}
	tp := newTestProxy(t, names, nil, nil)
	tp.register(mustCompile(t, Config{AllowOut: []string{"api.example.test"}}, false))
	open := func() (net.Conn, *bufio.Reader) {
		c, err := tp.dial(real.addr)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
		if res, err := http.ReadResponse(br, nil); err != nil {
			t.Fatal(err)
		} else {
			io.Copy(io.Discard, res.Body)
		}
		return c, br
	}
	c, br := open()
	defer c.Close()
	// Still allowed: the connection lives on.
	tp.register(mustCompile(t, Config{AllowOut: []string{"api.example.test", "x.test"}}, false))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
	if res, err := http.ReadResponse(br, nil); err != nil {
		t.Fatalf("a connection the new policy still allows: %v", err)
	} else {
		io.Copy(io.Discard, res.Body)
	}
	// No longer allowed: cut.
	tp.register(mustCompile(t, Config{AllowOut: []string{"x.test"}}, false))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
	_, err := http.ReadResponse(br, nil)
	mustBeReset(t, "a connection the new policy forbids", err)
	if !slices.ContainsFunc(tp.entries(), func(e Entry) bool { return e.Decision == Allow && e.Host == "api.example.test" }) {
		t.Error("no audit entry of the allowed connection")
	}
}

// Connections that are no sandbox's are reset, and the warnings about
// them are rate-limited: a flood of them logs a few lines, the later ones
// saying how many were not logged.
func TestStrayConnectionWarningsAreLimited(t *testing.T) {
	var logged testenv.Buffer
	p, err := NewProxy(ProxyConfig{
		Refused:     func(netip.Addr) bool { return false },
		OriginalDst: func(net.Conn) (netip.AddrPort, error) { return netip.AddrPort{}, errors.New("none") },
		Logger:      slog.New(slog.NewTextHandler(&logged, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(ln)
	defer p.Close()
	const flood = 200
	for range flood {
		c, err := net.Dial("tcp4", ln.Addr().String()) // from 127.0.0.1, which no sandbox has
		if errors.Is(err, syscall.ECONNRESET) {
			continue // reset before connect returned
		} else if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a stray connection got bytes")
		}
		c.Close()
	}
	lines := strings.Count(logged.String(), "no proxied sandbox")
	if lines == 0 || lines > strayWarnBurst+3 {
		t.Errorf("%d stray connections logged %d warnings, want 1 to %d", flood, lines, strayWarnBurst+3)
	}
	time.Sleep(1100 * time.Millisecond)
	if c, err := net.Dial("tcp4", ln.Addr().String()); err == nil {
		c.Read(make([]byte, 1)) // reset after the warning is written
		c.Close()
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // a reset at connect may come before the line is written
	if !regexp.MustCompile(`not_logged_since_last=(1[0-9]{2}|[2-9][0-9])`).MatchString(logged.String()) {
		t.Errorf("no warning says how many were not logged:\n%s", logged.String())
	}
}

// Every request on a plain-HTTP connection is judged by its own Host, not
// only the first: a server that hosts an allowed name and a forbidden one
// at the same address (a CDN, a shared host) must not get the second
// through a connection opened for the first.
func TestProxyJudgesEachPlainHTTPRequest(t *testing.T) {
	real, _ := twinServers(t, nil)
	names := fakeResolver{"api.example.test": {real.addr.Addr()}, "evil.test": {real.addr.Addr()}}
	tp := newTestProxy(t, names, nil, nil)
	tp.register(mustCompile(t, Config{AllowOut: []string{"api.example.test"}}, false))
	for _, second := range []string{
		"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"GET http://evil.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
	} {
		before := real.requests.Load()
		c, err := tp.dial(real.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		rd := bufio.NewReader(c)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
		res, err := http.ReadResponse(rd, nil)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("the first request, to an allowed host: %v, %v", res, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		fmt.Fprint(c, second)
		res, err = http.ReadResponse(rd, nil)
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode == http.StatusOK {
				t.Errorf("second request %q on the connection: %s %q; want it refused", second, res.Status, body)
			}
		}
		c.Close()
		if n := real.requests.Load() - before; n != 1 {
			t.Errorf("second request %q: the server got %d requests on the connection; want only the allowed one", second, n)
		}
	}
	var denied int
	for _, e := range tp.entries() {
		if e.Decision == Deny && e.Proto == string(KindHTTP) {
			denied++
		}
	}
	if denied != 2 {
		t.Errorf("%d denied HTTP requests in the audit; want 2: %+v", denied, tp.entries())
	}
}
