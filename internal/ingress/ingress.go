// Package ingress gives the sandbox proxy its TLS: the E2B SDK, a browser
// or any client reaches a sandbox's port as https://{port}-{id}.{domain}
// on port 443 when E2B_SANDBOX_URL is not set.
//
// The certificate is the operator's (a wildcard for *.{domain}, from
// --tls-cert and --tls-key), or, without one, a leaf that Warren's local
// CA signs for the name the client asks for (SNI), the way local
// development tools do. The CA is made once per data dir and domain
// (DATA/ingress/<domain>/ca.pem, its key ca-key.pem with mode 0600) and is
// name-constrained to the domain: trusting it (NODE_EXTRA_CA_CERTS, a
// browser's authorities) trusts it for that domain's names and nothing
// else, so its key cannot impersonate any other site. A leaf is made for
// one name ({label}.{domain}, or the domain itself): browsers and Node
// refuse a wildcard directly under a top-level name such as *.localhost.
// Leaves are cached (at most maxLeaves, least recently used dropped first)
// and renewed a day before they expire.
package ingress

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Config says where certificates come from.
type Config struct {
	// Domain is what sandbox hosts end in: {port}-{id}.{Domain}.
	Domain string
	// CertFile and KeyFile are the operator's certificate chain and key
	// (PEM). Both or neither.
	CertFile, KeyFile string
	// DataDir holds the local CA when no certificate is given.
	DataDir string
	// Now is the clock leaves are dated by; nil: time.Now.
	Now func() time.Time
}

// Leaf lifetimes and the cache bound.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 30 * 24 * time.Hour
	leafRenew    = 24 * time.Hour // before expiry
	maxLeaves    = 4096
)

// Certs answers TLS handshakes with the right certificate.
type Certs struct {
	cfg    Config
	domain string
	fixed  *tls.Certificate // the operator's
	caFile string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	// leafKey signs nothing; it is the public key of every leaf.
	leafKey *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*list.Element // name → *leaf in lru
	lru    *list.List               // most recently used first
}

type leaf struct {
	name string
	cert *tls.Certificate
}

// New loads the operator's certificate, or opens (making it the first
// time) the local CA of cfg.DataDir and cfg.Domain.
func New(cfg Config) (*Certs, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	domain, ok := hostName(cfg.Domain)
	if !ok {
		return nil, fmt.Errorf("ingress: domain %q is not a host name", cfg.Domain)
	}
	c := &Certs{cfg: cfg, domain: domain, leaves: map[string]*list.Element{}, lru: list.New()}
	switch {
	case cfg.CertFile != "" || cfg.KeyFile != "":
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			return nil, errors.New("ingress: --tls-cert and --tls-key go together")
		}
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("ingress: --tls-cert/--tls-key: %w", err)
		}
		c.fixed = &cert
		return c, nil
	case cfg.DataDir == "":
		return nil, errors.New("ingress: no certificate and no data dir for a local CA")
	}
	if err := c.openCA(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	c.leafKey = key
	return c, nil
}

// CAFile is the local CA's certificate (what NODE_EXTRA_CA_CERTS names),
// or "" when the operator's certificate is served.
func (c *Certs) CAFile() string { return c.caFile }

// TLSConfig is the proxy's TLS configuration: HTTP/2 and HTTP/1.1, TLS
// 1.2 at least, the certificate chosen by the client's server name.
func (c *Certs) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: c.GetCertificate,
	}
}

// GetCertificate implements tls.Config.GetCertificate.
func (c *Certs) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c.fixed != nil {
		return c.fixed, nil
	}
	name, ok := hostName(hello.ServerName)
	if !ok || !c.covers(name) {
		// Nothing is signed for names outside the domain (the CA's
		// constraint would make such a leaf worthless anyway).
		return nil, fmt.Errorf("ingress: no certificate for server name %q: sandbox hosts are {port}-{sandboxID}.%s", hello.ServerName, c.domain)
	}
	return c.leafFor(name)
}

// covers reports whether the local CA signs for name: the domain itself,
// or one label directly under it (what sandbox hosts are).
func (c *Certs) covers(name string) bool {
	if name == c.domain {
		return true
	}
	label, rest, ok := strings.Cut(name, ".")
	return ok && rest == c.domain && label != ""
}

// leafFor returns the cached leaf for name, or signs one.
func (c *Certs) leafFor(name string) (*tls.Certificate, error) {
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.leaves[name]; ok {
		l := el.Value.(*leaf)
		if now.Add(leafRenew).Before(l.cert.Leaf.NotAfter) {
			c.lru.MoveToFront(el)
			return l.cert, nil
		}
		c.lru.Remove(el)
		delete(c.leaves, name)
	}
	cert, err := c.sign(name, now)
	if err != nil {
		return nil, err
	}
	c.leaves[name] = c.lru.PushFront(&leaf{name: name, cert: cert})
	for c.lru.Len() > maxLeaves {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.leaves, old.Value.(*leaf).name)
	}
	return cert, nil
}

// sign makes a leaf for name, valid from an hour ago (clocks differ) for
// leafLifetime.
func (c *Certs) sign(name string, now time.Time) (*tls.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &c.leafKey.PublicKey, c.caKey)
	if err != nil {
		return nil, fmt.Errorf("ingress: signing a certificate for %s: %w", name, err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, c.ca.Raw}, PrivateKey: c.leafKey, Leaf: parsed}, nil
}

// openCA reads the local CA of the data dir and domain, making it first if
// it does not exist. The key is written 0600 before its certificate, so a
// certificate on disk always has its key.
func (c *Certs) openCA() error {
	dir := filepath.Join(c.cfg.DataDir, "ingress", c.domain)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("ingress: %w", err)
	}
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	c.caFile = certFile
	certPEM, err := os.ReadFile(certFile)
	if errors.Is(err, os.ErrNotExist) {
		return c.makeCA(certFile, keyFile)
	}
	if err != nil {
		return fmt.Errorf("ingress: %w", err)
	}
	if fi, err := os.Stat(keyFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("ingress: %s is readable by others (mode %o): make it 0600, or remove the ingress directory to get a new CA", keyFile, fi.Mode().Perm())
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return fmt.Errorf("ingress: the local CA's key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("ingress: the local CA in %s: %w", dir, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return fmt.Errorf("ingress: the local CA's key in %s is not ECDSA", dir)
	}
	ca, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return err
	}
	if !ca.IsCA || c.cfg.Now().After(ca.NotAfter) {
		return fmt.Errorf("ingress: %s is not a valid CA certificate (expired?): remove %s to get a new one", certFile, dir)
	}
	c.ca, c.caKey = ca, key
	return nil
}

func (c *Certs) makeCA(certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	// Names say whose CA it is: this host, this data dir.
	host, _ := os.Hostname()
	sum := sha256.Sum256([]byte(c.cfg.DataDir))
	now := c.cfg.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:         fmt.Sprintf("Warren local CA for *.%s (%s %s)", c.domain, host, hex.EncodeToString(sum[:4])),
			Organization:       []string{"Warren local development CA"},
			OrganizationalUnit: []string{c.cfg.DataDir},
		},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		// Only names in the domain: trusting this CA trusts nothing else.
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         []string{c.domain},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("ingress: making the local CA: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	// A key without its certificate (a crash between the two) was never
	// used: it is replaced.
	if err := os.Remove(keyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("ingress: %w", err)
	}
	if err := writeNew(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	if err := writeNew(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	c.ca, err = x509.ParseCertificate(der)
	c.caKey = key
	return err
}

// writeNew writes a file that must not exist yet (O_EXCL: a link planted
// there is not followed), through a temporary name so a crash never
// leaves half of it.
func writeNew(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".new"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("ingress: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("ingress: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("ingress: %w", err)
	}
	return os.Remove(tmp)
}

// hostName is name in lower case without a trailing dot, if it is an
// ASCII host name: labels of letters, digits and '-'.
// Non-ASCII is refused before any case folding: Unicode folding would let
// the Kelvin sign stand for "k".
func hostName(name string) (string, bool) {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 {
		return "", false
	}
	b := []byte(name)
	for i, ch := range b {
		switch {
		case ch >= 'A' && ch <= 'Z':
			b[i] = ch + 'a' - 'A'
		case ch >= 'a' && ch <= 'z', ch >= '0' && ch <= '9', ch == '-', ch == '.':
		default:
			return "", false
		}
	}
	name = string(b)
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return "", false
		}
	}
	return name, true
}
