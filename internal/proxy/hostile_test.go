package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// fakeNode is a Resolver of three sandboxes at made-up addresses whose
// transports record the address the proxy dials and deliver the request
// to one local upstream instead. Sandbox "paused" is paused with
// autoResume.
type fakeNode struct {
	mu      sync.Mutex
	dialed  []string
	resumed []string
	paused  bool
	moved   bool  // "paused" was resumed at a new address
	err     error // Resolve's answer for "broken"
	up      string
	// ends are the tracked exchanges by sandbox; signedBy counts the
	// tokens SignedBy offered.
	ends     map[string]map[int]func()
	nextEnd  int
	signedBy int
}

var sandboxIPs = map[string]netip.Addr{
	"sbx1":   netip.MustParseAddr("10.99.0.2"),
	"sbx2":   netip.MustParseAddr("10.99.0.6"),
	"paused": netip.MustParseAddr("10.99.0.10"),
}

func (n *fakeNode) Resolve(_ context.Context, id string) (Target, error) {
	if id == "broken" {
		return Target{}, n.err
	}
	ip, ok := sandboxIPs[id]
	if !ok {
		return Target{}, ErrNotFound
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.mu.Lock()
		n.dialed = append(n.dialed, addr)
		n.mu.Unlock()
		return (&net.Dialer{}).DialContext(ctx, network, n.up)
	}}
	n.mu.Lock()
	defer n.mu.Unlock()
	if id == "paused" && n.moved {
		ip = netip.MustParseAddr("10.99.0.14") // resumed into another slot
	}
	if id == "paused" && n.paused {
		ip = netip.Addr{} // a paused sandbox has no address
	}
	return Target{IP: ip, Transport: tr, TrafficToken: "traffic-" + id, EnvdAccessToken: "envd-" + id, Paused: id == "paused" && n.paused}, nil
}

func (n *fakeNode) Resume(_ context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.resumed = append(n.resumed, id)
	n.paused = false
	n.moved = true
	return nil
}

func (n *fakeNode) Track(id string, end func()) (func(), error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := sandboxIPs[id]; !ok {
		return nil, ErrNotFound
	}
	if n.ends == nil {
		n.ends = map[string]map[int]func(){}
	}
	if n.ends[id] == nil {
		n.ends[id] = map[int]func(){}
	}
	n.nextEnd++
	key := n.nextEnd
	n.ends[id][key] = end
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.ends[id], key)
	}, nil
}

// kill ends the exchanges tracked for id, as the manager does on kill.
func (n *fakeNode) kill(id string) int {
	n.mu.Lock()
	ends := n.ends[id]
	delete(n.ends, id)
	n.mu.Unlock()
	for _, end := range ends {
		end()
	}
	return len(ends)
}

func (n *fakeNode) tracked(id string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.ends[id])
}

func (n *fakeNode) SignedBy(signed func(string) bool) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	found := ""
	for _, id := range []string{"sbx1", "sbx2", "paused"} {
		n.signedBy++
		if signed("envd-"+id) && found == "" {
			found = id
		}
	}
	if found == "" {
		return "", ErrNotFound
	}
	return found, nil
}

func (n *fakeNode) take() (dialed, resumed []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	dialed, resumed = n.dialed, n.resumed
	n.dialed, n.resumed = nil, nil
	return
}

func newFakeNode(t *testing.T) (*fakeNode, *Proxy, *testenv.Buffer) {
	return newFakeNodeWith(t, echo())
}

// newFakeNodeWith is newFakeNode whose sandboxes all answer with h.
func newFakeNodeWith(t *testing.T, h http.Handler) (*fakeNode, *Proxy, *testenv.Buffer) {
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	n := &fakeNode{up: strings.TrimPrefix(up.URL, "http://")}
	log := &testenv.Buffer{}
	return n, New(Config{Domain: "localhost", Resolver: n, Logger: slog.New(slog.NewTextHandler(log, nil))}), log
}

// serve sends a request straight to the handler, so that hosts no client
// would send (non-ASCII, broken) can be tried; hdr is name, value pairs
// and a name may repeat.
func serve(p *Proxy, remote, host string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/path", nil)
	r.Host = host
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	return w
}

func TestHostileRoutes(t *testing.T) {
	n, p, _ := newFakeNode(t)
	const tok = "E2b-Traffic-Access-Token"
	for _, c := range []struct {
		name   string
		host   string
		hdr    []string
		status int
		dial   string // the only address dialed, if any
	}{
		{"own sandbox, own token", "8000-sbx1.localhost:3002", []string{tok, "traffic-sbx1"}, 200, "10.99.0.2:8000"},
		{"another sandbox's ID with your token", "8000-sbx2.localhost", []string{tok, "traffic-sbx1"}, 403, ""},
		{"headers name another sandbox than the host", "8000-sbx1.localhost", []string{"E2b-Sandbox-Id", "sbx2", "E2b-Sandbox-Port", "8000", tok, "traffic-sbx1"}, 403, ""},
		{"no token", "8000-sbx1.localhost", nil, 403, ""},
		{"the API's address as host", "127.0.0.1:3000", nil, 400, ""},
		{"the API's name as host", "localhost:3000", nil, 400, ""},
		{"the API's port inside the sandbox is the sandbox's", "3000-sbx1.localhost", []string{tok, "traffic-sbx1"}, 200, "10.99.0.2:3000"},
		{"envd's port with a traffic token", "49983-sbx1.localhost", []string{tok, "traffic-sbx1"}, 200, "10.99.0.2:49983"},
		{"envd's port without one (envd checks its own)", "49983-sbx1.localhost", nil, 200, "10.99.0.2:49983"},
		{"port 0", "0-sbx1.localhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"port 65536", "65536-sbx1.localhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"port 65535", "65535-sbx1.localhost", []string{tok, "traffic-sbx1"}, 200, "10.99.0.2:65535"},
		{"leading zero", "08000-sbx1.localhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"signed port", "+8000-sbx1.localhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"non-numeric port", "http-sbx1.localhost", nil, 400, ""},
		{"header port 0", "", []string{"E2b-Sandbox-Id", "sbx1", "E2b-Sandbox-Port", "0"}, 400, ""},
		{"header port 65536", "", []string{"E2b-Sandbox-Id", "sbx1", "E2b-Sandbox-Port", "65536"}, 400, ""},
		{"header port with a space", "", []string{"E2b-Sandbox-Id", "sbx1", "E2b-Sandbox-Port", "80 "}, 400, ""},
		{"header port in hex", "", []string{"E2b-Sandbox-Id", "sbx1", "E2b-Sandbox-Port", "0x50"}, 400, ""},
		{"header ID with a path", "", []string{"E2b-Sandbox-Id", "../sbx1", "E2b-Sandbox-Port", "49983"}, 400, ""},
		{"upper case host", "8000-SBX1.LocalHost", []string{tok, "traffic-sbx1"}, 200, "10.99.0.2:8000"},
		{"trailing dot", "8000-sbx1.localhost.", []string{tok, "traffic-sbx1"}, 200, "10.99.0.2:8000"},
		{"trailing dot and port", "8000-sbx1.localhost.:3002", []string{tok, "traffic-sbx1"}, 200, "10.99.0.2:8000"},
		{"two trailing dots", "8000-sbx1.localhost..", []string{tok, "traffic-sbx1"}, 400, ""},
		{"IDN: a non-ASCII letter", "8000-sbx1.locaĸhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"IDN: the Kelvin sign, which folds to k", "8000-\u212Abx1.localhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"IDN: punycode label", "8000-xn--sbx1-abc.localhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"IPv6 literal", "[::1]:3002", nil, 400, ""},
		{"IPv6 literal without port", "[::1]", nil, 400, ""},
		{"bare IPv6", "::1", nil, 400, ""},
		{"IPv6 literal holding a route", "[8000-sbx1.localhost]:3002", nil, 400, ""},
		{"another domain", "8000-sbx1.evil.example", []string{tok, "traffic-sbx1"}, 400, ""},
		{"a label before", "a.8000-sbx1.localhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"a label between", "8000-sbx1.a.localhost", []string{tok, "traffic-sbx1"}, 400, ""},
		{"domain as a prefix", "8000-sbx1.localhost.evil.example", []string{tok, "traffic-sbx1"}, 400, ""},
		{"empty host", "", nil, 400, ""},
		{"host with a path", "8000-sbx1.localhost/x", nil, 400, ""},
		{"duplicate sandbox IDs", "", []string{"E2b-Sandbox-Id", "sbx1", "E2b-Sandbox-Id", "sbx2", "E2b-Sandbox-Port", "8000", tok, "traffic-sbx1"}, 400, ""},
		{"duplicate ports", "", []string{"E2b-Sandbox-Id", "sbx1", "E2b-Sandbox-Port", "49983", "E2b-Sandbox-Port", "8000"}, 400, ""},
		{"duplicate traffic tokens", "8000-sbx1.localhost", []string{tok, "traffic-sbx2", tok, "traffic-sbx1"}, 400, ""},
		{"unknown sandbox", "8000-nosuch.localhost", nil, 502, ""},
	} {
		w := serve(p, fmt.Sprintf("192.0.2.%d:1", len(c.name)), c.host, c.hdr...)
		dialed, _ := n.take()
		if w.Code != c.status {
			t.Errorf("%s (%q %v): %d %s, want %d", c.name, c.host, c.hdr, w.Code, w.Body.String(), c.status)
		}
		if c.dial == "" && len(dialed) > 0 || c.dial != "" && (len(dialed) != 1 || dialed[0] != c.dial) {
			t.Errorf("%s: dialed %v, want %q", c.name, dialed, c.dial)
		}
		if w.Code == 200 && strings.Contains(w.Body.String(), "traffic-") {
			t.Errorf("%s: the traffic token reached the sandbox: %s", c.name, w.Body.String())
		}
	}
}

func TestPausedSandboxResumesOnlyForCredentials(t *testing.T) {
	n, p, _ := newFakeNode(t)
	const tok = "E2b-Traffic-Access-Token"
	for _, c := range []struct {
		name    string
		host    string
		hdr     []string
		status  int
		resumes bool
	}{
		{"no traffic token", "8000-paused.localhost", nil, 403, false},
		{"another sandbox's traffic token", "8000-paused.localhost", []string{tok, "traffic-sbx1"}, 403, false},
		{"envd's port without its token", "49983-paused.localhost", nil, 401, false},
		{"envd's port with the traffic token only", "49983-paused.localhost", []string{tok, "traffic-paused"}, 401, false},
		{"envd's port with another sandbox's envd token", "49983-paused.localhost", []string{"X-Access-Token", "envd-sbx1"}, 401, false},
		{"envd's port with the token twice", "49983-paused.localhost", []string{"X-Access-Token", "envd-paused", "X-Access-Token", "envd-paused"}, 401, false},
		{"port 0 with the token", "0-paused.localhost", []string{tok, "traffic-paused"}, 400, false},
		{"non-numeric port with the token", "x-paused.localhost", []string{tok, "traffic-paused"}, 400, false},
		{"the traffic token", "8000-paused.localhost", []string{tok, "traffic-paused"}, 200, true},
		{"envd's port with envd's token", "49983-paused.localhost", []string{"X-Access-Token", "envd-paused"}, 200, true},
	} {
		n.mu.Lock()
		n.paused = true
		n.mu.Unlock()
		w := serve(p, "192.0.2.99:1", c.host, c.hdr...)
		dialed, resumed := n.take()
		if w.Code != c.status || (len(resumed) > 0) != c.resumes {
			t.Errorf("%s: %d %s, resumed %v; want %d, resumed=%v", c.name, w.Code, w.Body.String(), resumed, c.status, c.resumes)
		}
		if !c.resumes && len(dialed) > 0 {
			t.Errorf("%s: dialed %v", c.name, dialed)
		}
	}
}

// A sandbox resumed by traffic has a new address (a fresh slot): the
// request goes there, not to where the sandbox was before its pause.
func TestResumedSandboxIsReachedAtItsNewAddress(t *testing.T) {
	n, p, _ := newFakeNode(t)
	n.mu.Lock()
	n.paused = true
	n.mu.Unlock()
	w := serve(p, "192.0.2.98:1", "8000-paused.localhost", "E2b-Traffic-Access-Token", "traffic-paused")
	dialed, resumed := n.take()
	if w.Code != 200 || fmt.Sprint(resumed) != "[paused]" || fmt.Sprint(dialed) != "[10.99.0.14:8000]" {
		t.Errorf("%d, resumed %v, dialed %v", w.Code, resumed, dialed)
	}
}

func TestWrongTokensSpendTheAddressBudget(t *testing.T) {
	n, p, _ := newFakeNode(t)
	const attacker = "198.51.100.7:999"
	for i := range authFailureBurst {
		if w := serve(p, attacker, "8000-sbx1.localhost", "E2b-Traffic-Access-Token", fmt.Sprint("guess", i)); w.Code != 403 {
			t.Fatalf("guess %d: %d", i, w.Code)
		}
	}
	w := serve(p, attacker, "8000-sbx1.localhost", "E2b-Traffic-Access-Token", "guess")
	if w.Code != 429 || w.Header().Get("Retry-After") == "" {
		t.Errorf("a wrong token past the budget: %d Retry-After=%q", w.Code, w.Header().Get("Retry-After"))
	}
	// Only failures are refused: behind a load balancer every client has
	// this address, and the right token is served from it.
	if w := serve(p, attacker, "8000-sbx1.localhost", "E2b-Traffic-Access-Token", "traffic-sbx1"); w.Code != 200 {
		t.Errorf("the right token past the budget: %d %s", w.Code, w.Body.String())
	}
	if w := serve(p, "198.51.100.8:999", "8000-sbx1.localhost", "E2b-Traffic-Access-Token", "traffic-sbx1"); w.Code != 200 {
		t.Errorf("another address: %d", w.Code)
	}
	n.take()
}

func TestInternalErrorsNameOnlyARequestID(t *testing.T) {
	n, p, log := newFakeNode(t)
	n.err = errors.New("runc resume: open /run/warren/runc/secret/state.json: permission denied")
	w := serve(p, "192.0.2.1:1", "8000-broken.localhost")
	id := w.Header().Get("X-Request-Id")
	if w.Code != 500 || !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) {
		t.Fatalf("%d, request ID %q", w.Code, id)
	}
	if want := fmt.Sprintf(`{"code":500,"message":"internal error (request %s)"}`, id); strings.TrimSpace(w.Body.String()) != want {
		t.Errorf("body %s, want %s", w.Body.String(), want)
	}
	if !strings.Contains(log.String(), "request_id="+id) || !strings.Contains(log.String(), "permission denied") {
		t.Errorf("the log lacks the detail under the ID:\n%s", log.String())
	}
}

func TestUpstreamFailureHidesAddresses(t *testing.T) {
	// An upstream that hangs up mid-response: the proxy's error must not
	// carry the sandbox's inner address.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer up.Close()
	p := New(Config{Domain: "localhost", Resolver: resolverFunc(func(context.Context, string) (Target, error) {
		return Target{IP: loopback}, nil
	})})
	port := strings.TrimPrefix(up.URL, "http://127.0.0.1:")
	w := serve(p, "192.0.2.1:1", port+"-sbx1.localhost")
	if w.Code != 502 || strings.Contains(w.Body.String(), "127.0.0.1") || !strings.Contains(w.Body.String(), "request ") {
		t.Errorf("%d %s", w.Code, w.Body.String())
	}
}

func TestProxyServerTimeouts(t *testing.T) {
	srv := NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A stream that lasts longer than the header timeout.
		for range 3 {
			io.WriteString(w, "tick\n")
			w.(http.Flusher).Flush()
			time.Sleep(200 * time.Millisecond)
		}
	}))
	if srv.WriteTimeout != 0 || srv.ReadTimeout != 0 || srv.ReadHeaderTimeout == 0 || srv.IdleTimeout == 0 || srv.MaxHeaderBytes != MaxHeaderBytes {
		t.Fatalf("limits %+v", srv)
	}
	srv.ReadHeaderTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	slow, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	io.WriteString(slow, "GET / HTTP/1.1\r\nHost: x\r\n")
	slow.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := io.ReadAll(slow); err != nil || time.Since(start) > 4*time.Second {
		t.Errorf("a client stuck in its headers was kept: %v after %v", err, time.Since(start))
	}
	res, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if b, err := io.ReadAll(res.Body); err != nil || strings.Count(string(b), "tick") != 3 {
		t.Errorf("a stream longer than the header timeout: %q %v", b, err)
	}
}
