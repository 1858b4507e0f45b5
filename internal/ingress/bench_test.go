package ingress

import (
	"crypto/tls"
	"fmt"
	"testing"
)

// BenchmarkLeafForANewName: what a handshake for a host name not seen
// yet costs the server on top of TLS: one ECDSA signature.
func BenchmarkLeafForANewName(b *testing.B) {
	c, err := New(Config{Domain: "localhost", DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := c.GetCertificate(&tls.ClientHelloInfo{ServerName: fmt.Sprintf("%d-bench.localhost", i)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandshake: a full TLS 1.3 handshake over loopback with a
// cached leaf (client and server in this process).
func BenchmarkHandshake(b *testing.B) {
	c, err := New(Config{Domain: "localhost", DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", c.TLSConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { conn.(*tls.Conn).Handshake(); conn.Close() }()
		}
	}()
	cfg := &tls.Config{ServerName: "8000-bench.localhost", InsecureSkipVerify: true}
	b.ResetTimer()
	for range b.N {
		conn, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		conn.Close()
	}
}
