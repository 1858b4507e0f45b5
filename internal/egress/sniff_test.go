package egress

import (
	"bytes"
	"crypto/tls"
	"net"
	"testing"
	"time"
)

// clientHello captures the first flight of a TLS client for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_ = c.Handshake()
	}()
	_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64<<10)
	n, _ := b.Read(buf)
	return buf[:n]
}

func TestSniff(t *testing.T) {
	hello := clientHello(t, "API.example.test")
	for _, c := range []struct {
		name string
		in   []byte
		kind Kind
		host string
	}{
		{"TLS", hello, KindTLS, "API.example.test"},
		{"TLS without SNI", clientHello(t, ""), KindTLS, ""},
		{"HTTP", []byte("GET /x HTTP/1.1\r\nHost: api.example.test:8080\r\nX: y\r\n\r\nbody"), KindHTTP, "api.example.test:8080"},
		{"HTTP absolute", []byte("GET http://abs.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"), KindHTTP, "abs.test"},
		{"SSH", []byte("SSH-2.0-OpenSSH\r\n"), KindOther, ""},
		{"binary", []byte{0, 1, 2, 3}, KindOther, ""},
		{"truncated TLS", hello[:20], KindOther, ""},
	} {
		r, err := sniff(&replayConn{r: bytes.NewReader(c.in)})
		if err != nil || r.kind != c.kind || r.host != c.host {
			t.Errorf("%s: %v %q %v; want %v %q", c.name, r.kind, r.host, err, c.kind, c.host)
		}
		if !bytes.HasPrefix(c.in, r.data) || len(r.data) == 0 {
			t.Errorf("%s: the recorded bytes are not the input's start", c.name)
		}
	}
}

func FuzzSniff(f *testing.F) {
	f.Add(clientHello(f, "a.example"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte("CONNECT a:443 HTTP/1.1\r\n\r\n"))
	f.Add([]byte{0x16, 3, 1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, _ := sniff(&replayConn{r: bytes.NewReader(in)})
		if !bytes.HasPrefix(in, r.data) || len(r.data) > maxSniff {
			t.Fatalf("recorded %d bytes that are not the input's start", len(r.data))
		}
		_ = NormalizeHost(r.host)
	})
}
