package server

import (
	"context"
	"strings"

	"github.com/warren-sandbox/warren/internal/identity"
	"github.com/warren-sandbox/warren/internal/store"
)

// fallbackTrustDomain is the trust domain when neither
// --identity-trust-domain nor --domain makes one.
const fallbackTrustDomain = "warren"

// trustDomain is --identity-trust-domain, or --domain when it is a
// trust domain's name (a --domain that is not one must not stop a server
// that uses no identity tokens from starting).
func trustDomain(cfg Config) string {
	if cfg.IdentityTrustDomain != "" {
		return cfg.IdentityTrustDomain
	}
	if d := strings.ToLower(cfg.Domain); identity.ValidTrustDomain(d) {
		return d
	}
	return fallbackTrustDomain
}

// issuer is --identity-issuer without a trailing '/', as tokens and the
// discovery document name it.
func issuer(cfg Config) string { return strings.TrimSuffix(cfg.IdentityIssuer, "/") }

// clusterJWKS is every node's identity key, as the nodes registered
// them (a node that is gone keeps its key published: the tokens it
// minted expire within identity.Lifetime, and it may come back).
func clusterJWKS(st store.NodeStore) func(ctx context.Context) (identity.JWKS, error) {
	return func(ctx context.Context) (identity.JWKS, error) {
		nodes, err := st.ListNodes(ctx)
		if err != nil {
			return identity.JWKS{}, err
		}
		set := identity.JWKS{Keys: []identity.JWK{}}
		seen := map[string]bool{}
		for _, n := range nodes {
			if n.IdentityKey == "" {
				continue
			}
			k, _, err := identity.ParseJWK(n.IdentityKey)
			if err != nil || seen[k.Kid] {
				continue
			}
			seen[k.Kid] = true
			set.Keys = append(set.Keys, k)
		}
		return set, nil
	}
}
