package egress

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// socksServer is a SOCKS5 server for tests (RFC 1928 CONNECT, RFC 1929
// user/password when user is set). It resolves names itself, from names,
// and records every target it was asked for as it was sent: "name:port"
// for a domain, "ip:port" for an address.
type socksServer struct {
	addr       netip.AddrPort
	user, pass string
	names      map[string]netip.Addr

	mu      sync.Mutex
	targets []string
	creds   []string // what clients authenticated with, "user:pass"
}

func startSOCKS(t *testing.T, host, user, pass string, names map[string]netip.Addr) *socksServer {
	t.Helper()
	ln := listenOn(t, host, 0)
	s := &socksServer{addr: netip.MustParseAddrPort(ln.Addr().String()), user: user, pass: pass, names: names}
	serveEach(ln, s.serve)
	return s
}

func (s *socksServer) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.targets...)
}

func (s *socksServer) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil || hdr[0] != 5 {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return
	}
	want := byte(0)
	if s.user != "" {
		want = 2
	}
	if bytes.IndexByte(methods, want) < 0 {
		c.Write([]byte{5, 0xff})
		return
	}
	c.Write([]byte{5, want})
	if want == 2 {
		user, pass, ok := readUserPass(c)
		if !ok {
			return
		}
		s.mu.Lock()
		s.creds = append(s.creds, user+":"+pass)
		s.mu.Unlock()
		if user != s.user || pass != s.pass {
			c.Write([]byte{1, 1})
			return
		}
		c.Write([]byte{1, 0})
	}
	var req [4]byte
	if _, err := io.ReadFull(c, req[:]); err != nil || req[0] != 5 || req[1] != 1 {
		return
	}
	var host string
	var dst netip.Addr
	switch req[3] {
	case 1:
		var a [4]byte
		if _, err := io.ReadFull(c, a[:]); err != nil {
			return
		}
		dst = netip.AddrFrom4(a)
		host = dst.String()
	case 3:
		var n [1]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		name := make([]byte, n[0])
		if _, err := io.ReadFull(c, name); err != nil {
			return
		}
		host = string(name)
		dst = s.names[host]
	default:
		c.Write([]byte{5, 8, 0, 1, 0, 0, 0, 0, 0, 0})
		return
	}
	var p [2]byte
	if _, err := io.ReadFull(c, p[:]); err != nil {
		return
	}
	port := binary.BigEndian.Uint16(p[:])
	s.mu.Lock()
	s.targets = append(s.targets, net.JoinHostPort(host, strconv.Itoa(int(port))))
	s.mu.Unlock()
	if !dst.IsValid() {
		c.Write([]byte{5, 4, 0, 1, 0, 0, 0, 0, 0, 0}) // host unreachable
		return
	}
	up, err := net.DialTimeout("tcp4", netip.AddrPortFrom(dst, port).String(), 5*time.Second)
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0}) // connection refused
		return
	}
	defer up.Close()
	_ = c.SetDeadline(time.Time{})
	c.Write([]byte{5, 0, 0, 1, 127, 0, 0, 1, 0, 0})
	go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
	io.Copy(c, up)
}

func readUserPass(c net.Conn) (user, pass string, ok bool) {
	var b [2]byte
	if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != 1 {
		return "", "", false
	}
	u := make([]byte, b[1])
	if _, err := io.ReadFull(c, u); err != nil {
		return "", "", false
	}
	if _, err := io.ReadFull(c, b[:1]); err != nil {
		return "", "", false
	}
	p := make([]byte, b[0])
	if _, err := io.ReadFull(c, p); err != nil {
		return "", "", false
	}
	return string(u), string(p), true
}

// An egressProxy at a bare host:port is SOCKS5, as in E2B: an allowed
// address is asked for by address, a domain-matched flow by its name
// (remote DNS: the node never resolves it), with the credentials.
func TestProxyUpstreamSOCKS5(t *testing.T) {
	real, _ := twinServers(t, nil)
	names := map[string]netip.Addr{"api.example.test": real.addr.Addr()}
	up := startSOCKS(t, "127.0.0.6", "user", "p@ss:word", names)
	tp := newTestProxy(t, fakeResolver{}, nil, nil) // the node resolves nothing
	cfg := Config{AllowOut: []string{"api.example.test"}, EgressProxy: &UpstreamProxy{Address: up.addr.String(), Username: "user", Password: "p@ss:word"}}
	tp.register(mustCompile(t, cfg, true))
	if got, err := get(tp.client(real.addr, nil), "http://"+real.addr.String()+"/"); err != nil || !strings.HasPrefix(got, "server=real") {
		t.Fatalf("by address through the SOCKS5 proxy: %q, %v", got, err)
	}
	// The sandbox dialled an address the name does not resolve to (it
	// never could: the node cannot resolve it); the proxy gets the name.
	elsewhere := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), real.addr.Port())
	if got, err := get(tp.client(elsewhere, nil), "http://api.example.test:"+strconv.Itoa(int(real.addr.Port()))+"/"); err != nil || !strings.HasPrefix(got, "server=real") {
		t.Fatalf("by name through the SOCKS5 proxy: %q, %v", got, err)
	}
	seen := up.seen()
	wantName := net.JoinHostPort("api.example.test", strconv.Itoa(int(real.addr.Port())))
	if len(seen) == 0 || seen[0] != real.addr.String() {
		t.Errorf("the proxy was asked for %v; want the address %s first", seen, real.addr)
	}
	if !containsString(seen, wantName) {
		t.Errorf("the proxy was asked for %v; want the name %s (remote DNS)", seen, wantName)
	}
	for _, e := range tp.entries() {
		if e.Decision == Allow && e.Via != up.addr.String() {
			t.Errorf("an allowed connection went via %q, not the proxy: %+v", e.Via, e)
		}
	}
}

// Credentials the proxy refuses, a proxy that wants some when none are
// configured, and a proxy at an address the node refuses: the
// connection is refused (never sent directly), the audit says why, and
// never holds the password.
func TestProxyUpstreamSOCKS5Refusals(t *testing.T) {
	real, _ := twinServers(t, nil)
	up := startSOCKS(t, "127.0.0.6", "user", "pass", nil)
	tp := newTestProxy(t, fakeResolver{}, nil, nil)
	url := "http://" + real.addr.String() + "/"
	tp.register(mustCompile(t, Config{EgressProxy: &UpstreamProxy{Address: up.addr.String(), Username: "user", Password: "wrong-secret"}}, true))
	_, err := get(tp.client(real.addr, nil), url)
	mustBeReset(t, "a SOCKS5 proxy refusing the password", err)
	tp.register(mustCompile(t, Config{EgressProxy: &UpstreamProxy{Address: up.addr.String()}}, true))
	_, err = get(tp.client(real.addr, nil), url)
	mustBeReset(t, "a SOCKS5 proxy that wants a password, given none", err)
	tp.register(mustCompile(t, Config{EgressProxy: &UpstreamProxy{Address: netip.AddrPortFrom(refusedInTests, up.addr.Port()).String(), Username: "user", Password: "pass"}}, true))
	_, err = get(tp.client(real.addr, nil), url)
	mustBeReset(t, "a SOCKS5 proxy at a refused address", err)
	if n := real.requests.Load(); n != 0 {
		t.Errorf("the server got %d requests, want none", n)
	}
	var reasons []string
	for _, e := range tp.entries() {
		if e.Decision == Deny {
			reasons = append(reasons, e.Reason)
		}
		if strings.Contains(e.Reason, "wrong-secret") {
			t.Errorf("the audit holds the password: %+v", e)
		}
	}
	for _, want := range []string{"authentication failed", "no acceptable authentication methods", "the node refuses sandboxes that address"} {
		if !containsSubstring(reasons, want) {
			t.Errorf("no refusal says %q: %q", want, reasons)
		}
	}
}

// hostileSOCKS answers every connection with script: it reads what the
// client sends in each step before answering that step, unless the
// step's answer is sent early.
type socksStep struct {
	read  int    // bytes to read from the client first (0: none)
	write []byte // then the answer
}

func hostileSOCKS(t *testing.T, steps ...socksStep) netip.AddrPort {
	t.Helper()
	ln := listenOn(t, "127.0.0.7", 0)
	serveEach(ln, func(c net.Conn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		for _, s := range steps {
			if s.read > 0 {
				if _, err := io.ReadFull(c, make([]byte, s.read)); err != nil {
					return
				}
			}
			if _, err := c.Write(s.write); err != nil {
				return
			}
		}
		io.Copy(io.Discard, c)
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// Replies that break RFC 1928/1929, or that try to pass data off as part
// of the handshake, end the dial with an error naming the fault, within
// the dial timeout; nothing the proxy says becomes tunnel data unless
// the proxy said the tunnel was open.
func TestSOCKS5HostileReplies(t *testing.T) {
	const target = "198.51.100.1:80" // never dialled: the proxies are scripted
	greetNoAuth, greetAuth := 3, 4   // 05 01 00 / 05 02 00 02
	userPass := 1 + 1 + 4 + 1 + 4    // "user" / "pass"
	connectReq := 10                 // 05 01 00 01 a a a a p p
	ok := []byte{5, 0, 0, 1, 1, 2, 3, 4, 0, 80}
	cases := []struct {
		name  string
		auth  bool
		steps []socksStep
		want  string
	}{
		{"not SOCKS5 at all", false, []socksStep{{greetNoAuth, []byte("HTTP/1.1 400 Bad Request\r\n\r\n")}}, "unexpected protocol version"},
		{"no acceptable method", false, []socksStep{{greetNoAuth, []byte{5, 0xff}}}, "no acceptable authentication methods"},
		{"a method that was not offered", false, []socksStep{{greetNoAuth, []byte{5, 2}}, {connectReq, ok}}, "a method it was not offered"},
		{"an unknown method", true, []socksStep{{greetAuth, []byte{5, 0x80}}}, "a method it was not offered"},
		{"auth reply of another version", true, []socksStep{{greetAuth, []byte{5, 2}}, {userPass, []byte{5, 0}}}, "invalid username/password version"},
		{"auth refused", true, []socksStep{{greetAuth, []byte{5, 2}}, {userPass, []byte{1, 1}}}, "authentication failed"},
		{"connect refused", false, []socksStep{{greetNoAuth, []byte{5, 0}}, {connectReq, []byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0}}}, "connection refused"},
		{"non-zero reserved byte", false, []socksStep{{greetNoAuth, []byte{5, 0}}, {connectReq, []byte{5, 0, 7, 1, 0, 0, 0, 0, 0, 0}}}, "reserved"},
		{"bogus address type", false, []socksStep{{greetNoAuth, []byte{5, 0}}, {connectReq, []byte{5, 0, 0, 9, 0, 0, 0, 0, 0, 0}}}, "unknown address type"},
		{"a domain longer than what follows", false, []socksStep{{greetNoAuth, []byte{5, 0}}, {connectReq, []byte{5, 0, 0, 3, 255, 'a', 'b'}}}, "timeout"},
		{"silence", false, []socksStep{{greetNoAuth, nil}}, "timeout"},
		// Answers sent before the question: a proxy pipelining a fake
		// success (and data) ahead of the request it answers.
		{"method and connect replies at once", false, []socksStep{{greetNoAuth, append([]byte{5, 0}, ok...)}}, "before it was asked"},
		{"auth and connect replies at once", true, []socksStep{{greetAuth, []byte{5, 2}}, {userPass, append([]byte{1, 0}, ok...)}}, "before it was asked"},
		{"data before the connect reply", false, []socksStep{{greetNoAuth, append([]byte{5, 0}, "HTTP/1.1 200 OK\r\n\r\n"...)}}, "before it was asked"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := hostileSOCKS(t, tc.steps...)
			d := &dialer{resolver: fakeResolver{}, timeout: 500 * time.Millisecond, refused: func(netip.Addr) bool { return false }}
			up := &UpstreamProxy{Address: addr.String()}
			if tc.auth {
				up.Username, up.Password = "user", "pass"
			}
			start := time.Now()
			c, err := d.viaProxy(context.Background(), up, target)
			if err == nil {
				c.Close()
				t.Fatalf("the dial succeeded; want an error saying %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q; want one saying %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "egress proxy "+addr.String()) {
				t.Errorf("error %q does not name the proxy", err)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("the dial took %s; the handshake is bounded by the dial timeout", took)
			}
		})
	}
}

// What the destination sends right after the proxy's success reply (a
// server that speaks first) is tunnel data: handed on whole, nothing
// swallowed by the handshake.
func TestSOCKS5DataAfterReplyIsTunnelData(t *testing.T) {
	banner := []byte("SSH-2.0-test\r\n")
	addr := hostileSOCKS(t, socksStep{3, []byte{5, 0}}, socksStep{10, append([]byte{5, 0, 0, 3, 4, 'h', 'o', 's', 't', 0, 22}, banner...)})
	d := &dialer{resolver: fakeResolver{}, timeout: time.Second, refused: func(netip.Addr) bool { return false }}
	c, err := d.viaProxy(context.Background(), &UpstreamProxy{Address: addr.String()}, "198.51.100.1:22")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	got := make([]byte, len(banner))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, banner) {
		t.Errorf("tunnel data %q, %v; want %q", got, err, banner)
	}
	if _, ok := c.(interface{ CloseWrite() error }); !ok {
		t.Errorf("the tunnel (%T) cannot be half-closed", c)
	}
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func containsSubstring(list []string, s string) bool {
	for _, x := range list {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}
