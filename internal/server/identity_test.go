package server

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/identity"
	"github.com/warren-sandbox/warren/internal/store"
)

// The API's JWKS is every node's registered key, once each; a key that
// does not parse is left out, and a kid is the key's own thumbprint
// whatever the record says.
func TestClusterJWKS(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, _ := identity.LoadSigner(t.TempDir(), "warren.test", "")
	b, _ := identity.LoadSigner(t.TempDir(), "warren.test", "")
	lying := b.JWK()
	lying.Kid = a.KeyID()
	now := time.Now()
	for _, n := range []store.Node{
		{Name: "n1", IdentityKey: a.JWK().String()}, {Name: "n2", IdentityKey: lying.String()},
		{Name: "n3", IdentityKey: a.JWK().String()}, {Name: "n4", IdentityKey: `{"kty":"RSA"}`}, {Name: "n5"},
	} {
		n.RegisteredAt, n.HeartbeatAt = now, now
		if err := st.RegisterNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	set, err := clusterJWKS(st)(ctx)
	if err != nil || len(set.Keys) != 2 || set.Keys[0].Kid != a.KeyID() || set.Keys[1].Kid != b.KeyID() {
		t.Fatalf("JWKS %+v %v", set, err)
	}
	tok, _ := b.Mint("t1", "sb1", "aud")
	if _, err := identity.Verify(tok, set, "warren.test", "aud"); err != nil {
		t.Errorf("a node's token does not verify against the cluster's JWKS: %v", err)
	}
}

func TestTrustDomain(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Domain: "Sandboxes.Example.com"}, "sandboxes.example.com"},
		{Config{Domain: "localhost", IdentityTrustDomain: "prod.example"}, "prod.example"},
		{Config{Domain: "example.com:8443"}, fallbackTrustDomain},
		{Config{IdentityTrustDomain: "Bad/TD"}, "Bad/TD"}, // refused by LoadSigner, with the flag named
	} {
		if got := trustDomain(c.cfg); got != c.want {
			t.Errorf("%+v: %q, want %q", c.cfg, got, c.want)
		}
	}
}
