package egress

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkProxyConnection measures one new connection's request and
// response (what the SDK benchmark calls connection setup) on loopback,
// straight to the server and through the proxy with a domain policy (it
// sniffs the Host, checks the name's addresses, dials and splices): the
// difference is the proxy's own cost, without gVisor or the redirect.
func BenchmarkProxyConnection(b *testing.B) {
	ln, err := net.Listen("tcp4", "127.0.0.2:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(ln)
	defer srv.Close()
	dst := netip.MustParseAddrPort(ln.Addr().String())

	audit, err := OpenAudit(b.TempDir(), 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer audit.Close()
	p, err := NewProxy(ProxyConfig{
		Refused:      func(netip.Addr) bool { return false },
		Resolver:     fakeResolver{"api.example.test": {dst.Addr()}},
		Audit:        audit,
		SniffTimeout: time.Second,
		Secrets:      func(context.Context, string, string) (string, error) { return "", nil },
		OriginalDst:  func(net.Conn) (netip.AddrPort, error) { return dst, nil },
	})
	if err != nil {
		b.Fatal(err)
	}
	pln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go p.Serve(pln)
	defer p.Close()
	request := []byte("GET / HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n")
	one := func(b *testing.B, addr string) {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write(request); err != nil {
			b.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		c.Close()
	}
	// domain-policy: the name is allowed and so is the rest (the proxy
	// dials as soon as the connection comes); domain-only: the rest is
	// denied, as with allowInternetAccess false (only the name opens the
	// address).
	for _, c := range []struct {
		name string
		cfg  *Config
	}{
		{"direct", nil},
		{"domain-policy", &Config{AllowOut: []string{"api.example.test"}}},
		{"domain-only", &Config{AllowOut: []string{"api.example.test"}, DenyOut: []string{"0.0.0.0/0"}}},
	} {
		addr := dst.String()
		if c.cfg != nil {
			pol, err := Compile(*c.cfg, false)
			if err != nil {
				b.Fatal(err)
			}
			p.Register(netip.MustParseAddr("127.0.0.1"), Sandbox{ID: "sbx1", TeamID: "team1", Policy: pol})
			addr = pln.Addr().String()
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				one(b, addr)
			}
		})
	}
}
