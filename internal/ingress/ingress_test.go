package ingress

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newCerts(t *testing.T, dir string) *Certs {
	t.Helper()
	c, err := New(Config{Domain: "localhost", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func caPool(t *testing.T, c *Certs) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(c.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("CA file holds no certificate")
	}
	return pool
}

func TestLocalCAIsMadeOnceAndKeptPrivate(t *testing.T) {
	dir := t.TempDir()
	c := newCerts(t, dir)
	if c.CAFile() != filepath.Join(dir, "ingress", "localhost", "ca.pem") {
		t.Errorf("CA file %s", c.CAFile())
	}
	fi, err := os.Stat(filepath.Join(dir, "ingress", "localhost", "ca-key.pem"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v %v", fi, err)
	}
	first, _ := os.ReadFile(c.CAFile())
	again := newCerts(t, dir)
	second, _ := os.ReadFile(again.CAFile())
	if !bytes.Equal(first, second) {
		t.Error("a second start made a new CA: trust given to the first is lost")
	}
	// A leaf of the second start verifies against the CA of the first.
	cert, err := again.GetCertificate(&tls.ClientHelloInfo{ServerName: "8000-abc.localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: caPool(t, c), DNSName: "8000-abc.localhost"}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}

	// A key others can read is refused, not used.
	os.Chmod(filepath.Join(dir, "ingress", "localhost", "ca-key.pem"), 0o644)
	if _, err := New(Config{Domain: "localhost", DataDir: dir}); err == nil || !strings.Contains(err.Error(), "0600") {
		t.Errorf("a world-readable CA key was accepted: %v", err)
	}

	// Another domain gets a CA of its own.
	other, err := New(Config{Domain: "sbx.example", DataDir: dir})
	if err != nil || other.CAFile() == c.CAFile() {
		t.Errorf("domain sbx.example: %v %s", err, other.CAFile())
	}
}

func TestOrphanKeyIsReplaced(t *testing.T) {
	dir := t.TempDir()
	c := newCerts(t, dir)
	os.Remove(c.CAFile()) // a crash between the key and the certificate
	c2 := newCerts(t, dir)
	if _, err := c2.GetCertificate(&tls.ClientHelloInfo{ServerName: "1-a.localhost"}); err != nil {
		t.Fatal(err)
	}
}

func TestLeavesOnlyForTheDomain(t *testing.T) {
	c := newCerts(t, t.TempDir())
	for _, name := range []string{"8000-abc.localhost", "49983-x1.LOCALHOST", "sandbox.localhost.", "localhost"} {
		cert, err := c.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		want := strings.ToLower(strings.TrimSuffix(name, "."))
		if len(cert.Leaf.DNSNames) != 1 || cert.Leaf.DNSNames[0] != want {
			t.Errorf("%s: leaf names %v", name, cert.Leaf.DNSNames)
		}
	}
	for _, name := range []string{"", "example.com", "a.b.localhost", "localhost.evil.example", "evil-localhost",
		"8000-\u212Abc.localhost", "127.0.0.1", "8000-abc..localhost", "*.localhost"} {
		if _, err := c.GetCertificate(&tls.ClientHelloInfo{ServerName: name}); err == nil {
			t.Errorf("signed a leaf for %q", name)
		}
	}
}

// TestCAIsConstrainedToItsDomain: even a certificate its key signs for
// another name does not verify, so trusting the CA trusts nothing else.
func TestCAIsConstrainedToItsDomain(t *testing.T) {
	c := newCerts(t, t.TempDir())
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "bank.example"}, DNSNames: []string{"bank.example"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &key.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := x509.ParseCertificate(der)
	if _, err := forged.Verify(x509.VerifyOptions{Roots: caPool(t, c), DNSName: "bank.example"}); err == nil {
		t.Error("the local CA vouches for bank.example")
	}
}

func TestLeafCacheIsBoundedAndRenews(t *testing.T) {
	now := time.Now()
	c, err := New(Config{Domain: "localhost", DataDir: t.TempDir(), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	hello := &tls.ClientHelloInfo{ServerName: "1-a.localhost"}
	a1, _ := c.GetCertificate(hello)
	a2, _ := c.GetCertificate(hello)
	if a1 != a2 {
		t.Error("the same name was signed twice")
	}
	for i := range maxLeaves + 10 {
		if _, err := c.GetCertificate(&tls.ClientHelloInfo{ServerName: fmt.Sprintf("%d-b.localhost", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.leaves) != maxLeaves || c.lru.Len() != maxLeaves {
		t.Errorf("cache holds %d/%d leaves, bound %d", len(c.leaves), c.lru.Len(), maxLeaves)
	}
	// Near its end a leaf is renewed.
	b1, _ := c.GetCertificate(&tls.ClientHelloInfo{ServerName: "5000-b.localhost"})
	now = now.Add(leafLifetime - leafRenew/2)
	b2, _ := c.GetCertificate(&tls.ClientHelloInfo{ServerName: "5000-b.localhost"})
	if b1 == b2 || !b2.Leaf.NotAfter.After(b1.Leaf.NotAfter) {
		t.Error("a leaf about to expire was not renewed")
	}
}

// TestServesHTTP2AndHTTP1: a real handshake with a client that trusts
// only the local CA, for both protocols.
func TestServesHTTP2AndHTTP1(t *testing.T) {
	c := newCerts(t, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: c.TLSConfig(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Proto, r.Host)
	})}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	addr := ln.Addr().String()
	for _, h2 := range []bool{true, false} {
		client := clientTo(addr, caPool(t, c), h2)
		res, err := client.Get("https://8000-abc.localhost/")
		if err != nil {
			t.Fatalf("h2=%v: %v", h2, err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		want := "HTTP/1.1"
		if h2 {
			want = "HTTP/2.0"
		}
		if string(body) != want+" 8000-abc.localhost" {
			t.Errorf("h2=%v: %s", h2, body)
		}
	}
	// A name outside the domain gets no certificate at all.
	if _, err := clientTo(addr, caPool(t, c), false).Get("https://example.com/"); err == nil {
		t.Error("handshake for example.com succeeded")
	}
}

// clientTo is a client that trusts only roots and dials addr whatever
// the URL's host, over HTTP/2 when h2.
func clientTo(addr string, roots *x509.CertPool, h2 bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: h2,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func TestOperatorCertificate(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "*.sbx.example"}, DNSNames: []string{"*.sbx.example"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)

	c, err := New(Config{Domain: "sbx.example", CertFile: certFile, KeyFile: keyFile, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if c.CAFile() != "" {
		t.Errorf("an operator certificate has no local CA, got %s", c.CAFile())
	}
	got, err := c.GetCertificate(&tls.ClientHelloInfo{ServerName: "8000-abc.sbx.example"})
	if err != nil || !bytes.Equal(got.Certificate[0], der) {
		t.Errorf("operator certificate not served: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ingress")); !os.IsNotExist(err) {
		t.Error("a local CA was made although a certificate was given")
	}
	if _, err := New(Config{Domain: "sbx.example", CertFile: certFile}); err == nil {
		t.Error("--tls-cert without --tls-key accepted")
	}
	if _, err := New(Config{Domain: "sbx.example", CertFile: keyFile, KeyFile: certFile}); err == nil {
		t.Error("swapped files accepted")
	}
}
