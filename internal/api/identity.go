package api

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/identity"
)

// The workload identity keys (package identity): a JWKS at
// identity.JWKSPath and, with an issuer, an OpenID discovery document
// naming it. Both are public and need no credentials; the keys are read
// from the store (every node registers its own) at most every
// jwksCacheFor, so that anonymous requests cannot load the store.

const (
	openIDConfigPath = "/.well-known/openid-configuration"
	jwksCacheFor     = 10 * time.Second
)

type jwksCache struct {
	mu   sync.Mutex
	at   time.Time
	keys identity.JWKS
}

func isIdentityDiscovery(r *http.Request) bool {
	return r.URL.Path == identity.JWKSPath || r.URL.Path == openIDConfigPath
}

func (s *Server) routeIdentity(mux *http.ServeMux) {
	if s.cfg.JWKS == nil {
		return
	}
	mux.HandleFunc("GET "+identity.JWKSPath, s.serveJWKS)
	if s.cfg.IdentityIssuer != "" {
		mux.HandleFunc("GET "+openIDConfigPath, s.serveOpenIDConfig)
	}
}

func (s *Server) serveJWKS(w http.ResponseWriter, r *http.Request) {
	keys, err := s.identityKeys(r.Context())
	if err != nil {
		s.log.ErrorContext(r.Context(), "reading the identity keys", "err", err)
		writeError(w, http.StatusServiceUnavailable, "the identity keys cannot be read now")
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=60")
	writeJSON(w, http.StatusOK, keys)
}

func (s *Server) identityKeys(ctx context.Context) (identity.JWKS, error) {
	c := &s.jwks
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < jwksCacheFor {
		return c.keys, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	keys, err := s.cfg.JWKS(ctx)
	if err != nil {
		return identity.JWKS{}, err
	}
	if keys.Keys == nil {
		keys.Keys = []identity.JWK{}
	}
	c.keys, c.at = keys, time.Now()
	return keys, nil
}

func (s *Server) serveOpenIDConfig(w http.ResponseWriter, r *http.Request) {
	iss := strings.TrimSuffix(s.cfg.IdentityIssuer, "/")
	writeJSON(w, http.StatusOK, map[string]any{
		"issuer":                                iss,
		"jwks_uri":                              iss + identity.JWKSPath,
		"id_token_signing_alg_values_supported": []string{"ES256"},
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
	})
}
