package clientaddr

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
)

func trusted(t *testing.T, cidrs ...string) *Trusted {
	t.Helper()
	var p Prefixes
	for _, c := range cidrs {
		if err := p.Set(c); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestPrefixesFlag(t *testing.T) {
	var p Prefixes
	if err := p.Set("10.0.0.0/8, 192.0.2.7,2001:db8::/32"); err != nil {
		t.Fatal(err)
	}
	if err := p.Set("::ffff:198.51.100.0/120"); err != nil {
		t.Fatal(err)
	}
	if got := p.String(); got != "10.0.0.0/8,192.0.2.7/32,2001:db8::/32,198.51.100.0/24" {
		t.Errorf("parsed %s", got)
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "10.0.0.1/8/2", "fe80::1%eth0"} {
		var q Prefixes
		if err := q.Set(bad); err == nil {
			t.Errorf("%q accepted: %v", bad, q)
		}
	}
}

func TestClient(t *testing.T) {
	tr := trusted(t, "10.0.0.0/8", "2001:db8:1::/48")
	lb := netip.MustParseAddr("10.0.0.2")
	for _, c := range []struct {
		name   string
		peer   netip.Addr
		xff    []string
		client string // "" for the peer
		before string
	}{
		{"an untrusted peer's header is ignored", netip.MustParseAddr("203.0.113.9"), []string{"198.51.100.1"}, "", ""},
		{"a trusted peer without a header", lb, nil, "", ""},
		{"one hop", lb, []string{"198.51.100.1"}, "198.51.100.1", ""},
		{"a client's own claim stays left of it", lb, []string{"1.2.3.4, 198.51.100.1"}, "198.51.100.1", "1.2.3.4"},
		{"trusted hops are skipped", lb, []string{"1.2.3.4, 198.51.100.1, 10.1.1.1", "10.2.2.2"}, "198.51.100.1", "1.2.3.4"},
		{"all trusted: the leftmost", lb, []string{"10.9.9.9, 10.1.1.1"}, "10.9.9.9", ""},
		{"garbage ends the walk at the trusted hop right of it", lb, []string{"198.51.100.1, nonsense, 10.1.1.1"}, "10.1.1.1", "198.51.100.1, nonsense"},
		{"garbage rightmost: the peer", lb, []string{"198.51.100.1, unknown"}, "", ""},
		{"ports and brackets", lb, []string{"198.51.100.1:5000, [2001:db8:1::5]:80"}, "198.51.100.1", ""},
		{"IPv6 client", lb, []string{"2001:db8:2::7"}, "2001:db8:2::7", ""},
		{"mapped addresses are unmapped", netip.MustParseAddr("::ffff:10.0.0.2"), []string{"::ffff:198.51.100.1"}, "198.51.100.1", ""},
		{"a zone is not an address", lb, []string{"fe80::1%eth0"}, "", ""},
	} {
		client, before, ok := tr.Client(c.peer, c.xff)
		want := c.client
		if want == "" {
			want = c.peer.Unmap().String()
		}
		if client.String() != want || strings.Join(before, ", ") != c.before || ok != (c.client != "") {
			t.Errorf("%s: client %s before %q ok %v, want %s %q", c.name, client, before, ok, want, c.before)
		}
	}
	var none *Trusted
	if c, _, ok := none.Client(lb, []string{"198.51.100.1"}); ok || c != lb {
		t.Errorf("no trusted proxies: %s %v", c, ok)
	}
}

// echo answers with what a handler behind Handler sees.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "remote=%s xff=%q fwd=%q realip=%q", r.RemoteAddr, r.Header.Values("X-Forwarded-For"), r.Header.Get("Forwarded"), r.Header.Get("X-Real-Ip"))
})

func TestHandler(t *testing.T) {
	h := trusted(t, "10.0.0.0/8").Handler(echo)
	do := func(remote string, hdr ...string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Body.String()
	}
	spoof := []string{"X-Forwarded-For", "1.2.3.4", "Forwarded", "for=1.2.3.4", "X-Real-Ip", "1.2.3.4"}
	if got, want := do("203.0.113.9:4000", spoof...), `remote=203.0.113.9:4000 xff=[] fwd="" realip=""`; got != want {
		t.Errorf("from an untrusted peer: %s, want %s", got, want)
	}
	if got, want := do("10.0.0.2:4000", "X-Forwarded-For", "1.2.3.4, 198.51.100.1", "X-Real-Ip", "5.6.7.8"), `remote=198.51.100.1:0 xff=["1.2.3.4"] fwd="" realip=""`; got != want {
		t.Errorf("from the load balancer: %s, want %s", got, want)
	}
	if got, want := do("10.0.0.2:4000"), `remote=10.0.0.2:4000 xff=[] fwd="" realip=""`; got != want {
		t.Errorf("from the load balancer, no header: %s, want %s", got, want)
	}
	// With no trusted proxies, every claim is removed.
	h = (*Trusted)(nil).Handler(echo)
	if got, want := do("10.0.0.2:4000", spoof...), `remote=10.0.0.2:4000 xff=[] fwd="" realip=""`; got != want {
		t.Errorf("nothing trusted: %s, want %s", got, want)
	}
}

// serveLoopback serves h on 127.0.0.1 through tr's PROXY listener and
// Handler, over TLS when tlsOn.
func serveLoopback(t *testing.T, tr *Trusted, tlsOn bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(tr.Handler(echo))
	srv.Listener.Close()
	srv.Listener = tr.Listen(ln)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted peers' bad handshakes
	if tlsOn {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}

// dialFrom connects to addr from the loopback address from (127.0.0.x),
// sends header (if any) and then one request, over TLS when tlsOn, and
// returns the status and body.
func dialFrom(t *testing.T, from, addr string, header *proxyproto.Header, tlsOn bool, hdr ...string) (int, string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if header != nil {
		if _, err := header.WriteTo(c); err != nil {
			t.Fatal(err)
		}
	}
	var rw io.ReadWriter = c
	if tlsOn {
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) // the test server's own certificate
		rw = tc
	}
	req, _ := http.NewRequest("GET", "http://x/", nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	req.Close = true
	if err := req.Write(rw); err != nil {
		return 0, err.Error()
	}
	res, err := http.ReadResponse(bufio.NewReader(rw), req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func proxyHeader(version byte, src string) *proxyproto.Header {
	return &proxyproto.Header{
		Version:           version,
		Command:           proxyproto.PROXY,
		TransportProtocol: proxyproto.TCPv4,
		SourceAddr:        &net.TCPAddr{IP: net.ParseIP(src), Port: 51000},
		DestinationAddr:   &net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 443},
	}
}

func TestProxyProtocolOnlyFromTrustedPeers(t *testing.T) {
	// 127.0.0.2 is the load balancer; 127.0.0.3 anyone else.
	tr := trusted(t, "127.0.0.2/32")
	for _, tlsOn := range []bool{false, true} {
		addr := serveLoopback(t, tr, tlsOn)
		for _, v := range []byte{1, 2} {
			code, body := dialFrom(t, "127.0.0.2", addr, proxyHeader(v, "198.51.100.1"), tlsOn)
			if code != 200 || !strings.HasPrefix(body, "remote=198.51.100.1:51000 ") {
				t.Errorf("tls %v: PROXY v%d from the load balancer: %d %s", tlsOn, v, code, body)
			}
			// From anyone else the header is not read: the request is
			// malformed (or the TLS handshake fails), never from
			// 198.51.100.1.
			code, body = dialFrom(t, "127.0.0.3", addr, proxyHeader(v, "198.51.100.1"), tlsOn)
			if code == 200 || strings.Contains(body, "198.51.100.1") {
				t.Errorf("tls %v: PROXY v%d from an untrusted peer: %d %s", tlsOn, v, code, body)
			}
		}
		// The header is optional from the load balancer, and then its
		// X-Forwarded-For counts.
		code, body := dialFrom(t, "127.0.0.2", addr, nil, tlsOn, "X-Forwarded-For", "198.51.100.4")
		if code != 200 || !strings.HasPrefix(body, "remote=198.51.100.4:0 ") {
			t.Errorf("tls %v: X-Forwarded-For from the load balancer: %d %s", tlsOn, code, body)
		}
		code, body = dialFrom(t, "127.0.0.3", addr, nil, tlsOn, "X-Forwarded-For", "198.51.100.4")
		if code != 200 || !strings.HasPrefix(body, "remote=127.0.0.3:") || strings.Contains(body, "198.51.100.4") {
			t.Errorf("tls %v: X-Forwarded-For from an untrusted peer: %d %s", tlsOn, code, body)
		}
		// PROXY then X-Forwarded-For: the PROXY source is the peer now,
		// and not a trusted proxy, so its header is dropped.
		code, body = dialFrom(t, "127.0.0.2", addr, proxyHeader(2, "198.51.100.1"), tlsOn, "X-Forwarded-For", "1.2.3.4")
		if code != 200 || !strings.HasPrefix(body, "remote=198.51.100.1:51000 xff=[]") {
			t.Errorf("tls %v: PROXY and X-Forwarded-For: %d %s", tlsOn, code, body)
		}
	}
}

func TestNoTrustedProxiesListensAsItWas(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := (&Trusted{}).Listen(ln); got != ln {
		t.Errorf("wrapped: %T", got)
	}
}
