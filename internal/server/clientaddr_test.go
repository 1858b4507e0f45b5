package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/warren-sandbox/warren/internal/clientaddr"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/store"
)

// The API and proxy listeners (HTTP and HTTPS) take the client's address
// from a --trusted-proxy's PROXY header and X-Forwarded-For, and from
// nobody else's.
func TestPublicListenersTrustOnlyTrustedProxies(t *testing.T) {
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	ls := &listeners{api: listen(), proxy: listen(), tls: []net.Listener{listen()}}
	defer ls.close()
	var trusted clientaddr.Prefixes
	if err := trusted.Set("127.0.0.2"); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Domain: "localhost", DataDir: t.TempDir(), TrustedProxies: trusted}
	who := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s xff=%q", name, r.RemoteAddr, r.Header.Get("X-Forwarded-For"))
		})
	}
	st, err := store.OpenSQLite(context.Background(), filepath.Join(cfg.DataDir, "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sealer, err := secret.LoadSealer(cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	srvs, _, err := publicServers(cfg, st, sealer, ls, &http.Server{Handler: who("api")}, who("proxy"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveUntil(ctx, slog.New(slog.DiscardHandler), srvs) }()
	defer func() { cancel(); <-done }()

	get := func(from string, ln net.Listener, tlsOn, proxyHeader bool, xff string) string {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if proxyHeader {
			h := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.ParseIP("198.51.100.1"), Port: 40000}, c.LocalAddr())
			if _, err := h.WriteTo(c); err != nil {
				t.Fatal(err)
			}
		}
		var rw io.ReadWriter = c
		if tlsOn {
			rw = tls.Client(c, &tls.Config{ServerName: "8000-abc.localhost", InsecureSkipVerify: true}) // Warren's local CA
		}
		req, _ := http.NewRequest("GET", "http://8000-abc.localhost/", nil)
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		if err := req.Write(rw); err != nil {
			return "error: " + err.Error()
		}
		res, err := http.ReadResponse(bufio.NewReader(rw), req)
		if err != nil {
			return "error: " + err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	for _, l := range []struct {
		name  string
		ln    net.Listener
		tlsOn bool
	}{{"api", ls.api, false}, {"proxy", ls.proxy, false}, {"proxy", ls.tls[0], true}} {
		if got := get("127.0.0.2", l.ln, l.tlsOn, true, ""); got != l.name+` 198.51.100.1:40000 xff=""` {
			t.Errorf("%s (tls %v): PROXY from the trusted proxy: %s", l.name, l.tlsOn, got)
		}
		if got := get("127.0.0.2", l.ln, l.tlsOn, false, "192.0.2.9, 198.51.100.2"); got != l.name+` 198.51.100.2:0 xff="192.0.2.9"` {
			t.Errorf("%s (tls %v): X-Forwarded-For from the trusted proxy: %s", l.name, l.tlsOn, got)
		}
		if got := get("127.0.0.3", l.ln, l.tlsOn, false, "198.51.100.2"); !strings.HasPrefix(got, l.name+" 127.0.0.3:") || !strings.HasSuffix(got, `xff=""`) {
			t.Errorf("%s (tls %v): X-Forwarded-For from anyone else: %s", l.name, l.tlsOn, got)
		}
		if got := get("127.0.0.3", l.ln, l.tlsOn, true, ""); strings.Contains(got, "198.51.100.1") {
			t.Errorf("%s (tls %v): PROXY from anyone else: %s", l.name, l.tlsOn, got)
		}
	}
}
