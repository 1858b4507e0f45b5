// Package identity is sandboxes' workload identity: short-lived
// JWT-SVIDs (SPIFFE's JWT identity documents) that a node mints for a
// sandbox and its egress proxy puts into the requests of hosts with
// rules (${e2b.identity.tokens.NAME}), so that a sandbox can prove to a
// third party who it is without any credential ever entering it.
//
// A token's subject is spiffe://<trust domain>/team/<team>/sandbox/<id>,
// its audience the one the sandbox's create asked for under that name;
// it is signed with ES256 by the node's identity key, a P-256 key kept
// in the data dir like the node's other keys (identity.key, mode 0600,
// made on first use). The public keys are published as a JWKS on the
// API (every node's key in a cluster: each registers its own in the
// store), so that a verifier needs nothing of Warren but that URL.
package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// KeyFile is the identity key's file name in the data dir.
const KeyFile = "identity.key"

// TokenType is the only workload token type there is (E2B's too).
const TokenType = "JWT-SVID"

// Lifetime is how long a minted token is valid. The egress proxy mints
// one per request, so it only has to outlive the request's way to the
// verifier; a stolen one is worth little.
const Lifetime = 5 * time.Minute

// JWKSPath is where the API publishes the keys.
const JWKSPath = "/.well-known/jwks.json"

// Signer mints a node's tokens.
type Signer struct {
	key         *ecdsa.PrivateKey
	kid         string
	trustDomain string
	issuer      string
	now         func() time.Time
}

// LoadSigner reads the identity key from dir, creating it (0600) on
// first use. trustDomain is the SPIFFE trust domain of the subjects;
// issuer, if not empty, is put in every token's iss.
func LoadSigner(dir, trustDomain, issuer string) (*Signer, error) {
	if !ValidTrustDomain(trustDomain) {
		return nil, fmt.Errorf("identity: %q is not a SPIFFE trust domain (lower-case letters, digits, '.', '-', '_')", trustDomain)
	}
	path := filepath.Join(dir, KeyFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if data, err = createKey(dir, path); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("identity: reading the key: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "EC PRIVATE KEY" {
		return nil, fmt.Errorf("identity: %s holds no EC private key", path)
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("identity: %s holds no P-256 key", path)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, err
		}
	}
	s := &Signer{key: key, trustDomain: trustDomain, issuer: issuer, now: time.Now}
	s.kid = PublicJWK(&key.PublicKey).Thumbprint()
	return s, nil
}

func createKey(dir, path string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return nil, fmt.Errorf("identity: writing the key: %w", err)
	}
	return data, os.Rename(tmp, path)
}

// ValidTrustDomain says whether td is a SPIFFE trust domain name.
func ValidTrustDomain(td string) bool {
	if td == "" || len(td) > 255 {
		return false
	}
	for _, c := range td {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '.' && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

// validSegment is what a team or sandbox ID may be to become a path
// segment of a SPIFFE ID: letters, digits, '.', '-', '_', not "." or
// "..". Anything else could make one subject read as another's.
func validSegment(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '.' && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

// SPIFFEID is a sandbox's identity in a trust domain.
func SPIFFEID(trustDomain, teamID, sandboxID string) (string, error) {
	if !validSegment(teamID) || !validSegment(sandboxID) {
		return "", errors.New("identity: a sandbox's identity needs its team and its ID")
	}
	return "spiffe://" + trustDomain + "/team/" + teamID + "/sandbox/" + sandboxID, nil
}

// Claims are a JWT-SVID's.
type Claims struct {
	jwt.RegisteredClaims
}

// MaxAudience bounds an audience's length.
const MaxAudience = 512

// Mint returns a fresh token for a team's sandbox, for audience.
func (s *Signer) Mint(teamID, sandboxID, audience string) (string, error) {
	sub, err := SPIFFEID(s.trustDomain, teamID, sandboxID)
	if err != nil {
		return "", err
	}
	if audience == "" || len(audience) > MaxAudience {
		return "", errors.New("identity: a token needs an audience")
	}
	now := s.now()
	var jti [16]byte
	if _, err := rand.Read(jti[:]); err != nil {
		return "", err
	}
	c := Claims{jwt.RegisteredClaims{
		Issuer: s.issuer, Subject: sub, Audience: jwt.ClaimStrings{audience},
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now.Add(-30 * time.Second)),
		ExpiresAt: jwt.NewNumericDate(now.Add(Lifetime)), ID: base64.RawURLEncoding.EncodeToString(jti[:]),
	}}
	t := jwt.NewWithClaims(jwt.SigningMethodES256, c)
	t.Header["kid"] = s.kid
	return t.SignedString(s.key)
}

// KeyID is the signer's key's ID (its RFC 7638 thumbprint).
func (s *Signer) KeyID() string { return s.kid }

// JWK is the signer's public key.
func (s *Signer) JWK() JWK { return PublicJWK(&s.key.PublicKey) }

// TrustDomain is the trust domain the signer's subjects are in.
func (s *Signer) TrustDomain() string { return s.trustDomain }

// JWK is a P-256 public key as RFC 7517 spells it.
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}

// JWKS is a key set (RFC 7517 section 5).
type JWKS struct {
	Keys []JWK `json:"keys"`
}

// PublicJWK returns pub as a JWK, its kid the thumbprint.
func PublicJWK(pub *ecdsa.PublicKey) JWK {
	raw, _ := pub.Bytes() // uncompressed point: 0x04 || X || Y, 32 bytes each
	k := JWK{Kty: "EC", Crv: "P-256", Alg: "ES256", Use: "sig",
		X: base64.RawURLEncoding.EncodeToString(raw[1:33]), Y: base64.RawURLEncoding.EncodeToString(raw[33:65])}
	k.Kid = k.Thumbprint()
	return k
}

// Thumbprint is the key's RFC 7638 thumbprint (SHA-256, base64url).
func (k JWK) Thumbprint() string {
	// The required members in lexicographic order, no white space.
	sum := sha256.Sum256([]byte(`{"crv":"` + k.Crv + `","kty":"` + k.Kty + `","x":"` + k.X + `","y":"` + k.Y + `"}`))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// String is the key as JSON, as a node registers it.
func (k JWK) String() string {
	b, _ := json.Marshal(k)
	return string(b)
}

// ParseJWK reads a P-256 public key; anything else is an error.
func ParseJWK(s string) (JWK, *ecdsa.PublicKey, error) {
	var k JWK
	if err := json.Unmarshal([]byte(s), &k); err != nil {
		return k, nil, err
	}
	pub, err := k.Public()
	k.Kid = k.Thumbprint() // the key names itself, whatever the JSON said
	return k, pub, err
}

// Public is the key as an ecdsa.PublicKey, checked to be on the curve.
func (k JWK) Public() (*ecdsa.PublicKey, error) {
	if k.Kty != "EC" || k.Crv != "P-256" {
		return nil, errors.New("identity: not a P-256 key")
	}
	x, err1 := base64.RawURLEncoding.DecodeString(k.X)
	y, err2 := base64.RawURLEncoding.DecodeString(k.Y)
	if err1 != nil || err2 != nil || len(x) != 32 || len(y) != 32 {
		return nil, errors.New("identity: a P-256 key's coordinates are 32 bytes each")
	}
	point := append(append([]byte{4}, x...), y...)
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), point)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	return pub, nil
}

// Verify checks a token against a key set: signed ES256 by one of its
// keys (by kid), unexpired, for audience, its subject a sandbox SPIFFE
// ID in trustDomain. It returns the subject. A verifier outside Warren
// does the same with any JWT library and the JWKS URL.
func Verify(token string, set JWKS, trustDomain, audience string) (string, error) {
	keys := map[string]*ecdsa.PublicKey{}
	for _, k := range set.Keys {
		if pub, err := k.Public(); err == nil && k.Kid != "" {
			keys[k.Kid] = pub
		}
	}
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		if pub := keys[kid]; pub != nil {
			return pub, nil
		}
		return nil, fmt.Errorf("no key %q in the set", kid)
	}, jwt.WithValidMethods([]string{"ES256"}), jwt.WithAudience(audience), jwt.WithExpirationRequired(), jwt.WithLeeway(5*time.Second))
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(c.Subject, "spiffe://"+trustDomain+"/team/") {
		return "", fmt.Errorf("subject %q is not in trust domain %s", c.Subject, trustDomain)
	}
	return c.Subject, nil
}
