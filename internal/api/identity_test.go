package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/warren-sandbox/warren/internal/identity"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// The identity keys are served to anyone (they are public), from a
// cache, and only GET; discovery only with an issuer.
func TestJWKSIsOpen(t *testing.T) {
	reads := 0
	key := identity.JWK{Kty: "EC", Crv: "P-256", X: "x", Y: "y", Kid: "k1", Alg: "ES256", Use: "sig"}
	hs := newHarness(t, Config{
		JWKS: func(context.Context) (identity.JWKS, error) {
			reads++
			return identity.JWKS{Keys: []identity.JWK{key}}, nil
		},
		IdentityIssuer: "https://api.warren.test",
	})
	for range 3 {
		w := hs.do(http.MethodGet, identity.JWKSPath, "", "")
		var set identity.JWKS
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &set) != nil || len(set.Keys) != 1 || set.Keys[0] != key {
			t.Fatalf("JWKS: %d %s", w.Code, w.Body)
		}
	}
	if reads != 1 {
		t.Errorf("the keys were read %d times for 3 requests", reads)
	}
	w := hs.do(http.MethodGet, "/.well-known/openid-configuration", "", "")
	var doc map[string]any
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &doc) != nil || doc["issuer"] != "https://api.warren.test" ||
		doc["jwks_uri"] != "https://api.warren.test"+identity.JWKSPath {
		t.Errorf("discovery: %d %s", w.Code, w.Body)
	}
	if w := hs.do(http.MethodPost, identity.JWKSPath, "", "{}"); w.Code == 200 {
		t.Errorf("POST JWKS: %d", w.Code)
	}
	// Nothing else opens up: another path still wants credentials.
	if w := hs.do(http.MethodGet, "/.well-known/other", "", ""); w.Code != 401 {
		t.Errorf("another .well-known path: %d", w.Code)
	}

	// Without keys (no JWKS) or without an issuer: 404, credentials or not.
	hs = newHarness(t, Config{})
	for _, p := range []string{identity.JWKSPath, "/.well-known/openid-configuration"} {
		if w := hs.do(http.MethodGet, p, keyTeam1, ""); w.Code != 404 {
			t.Errorf("%s without keys: %d", p, w.Code)
		}
	}
	// A store that fails is a 503, and not cached.
	hs = newHarness(t, Config{JWKS: func(context.Context) (identity.JWKS, error) { return identity.JWKS{}, errors.New("down") }})
	if w := hs.do(http.MethodGet, identity.JWKSPath, "", ""); w.Code != 503 {
		t.Errorf("keys unreadable: %d %s", w.Code, w.Body)
	}
}

// A create's iam reaches the manager as it was sent; an empty map is no
// workload identity (E2B).
func TestCreateTakesIAM(t *testing.T) {
	hs := newHarness(t, Config{})
	var got *sandbox.IAM
	hs.sandboxes.create = func(req sandbox.CreateRequest) (store.Sandbox, error) {
		got = req.Extra.IAM
		return store.Sandbox{ID: "sbx1", TeamID: req.TeamID.String(), TemplateID: req.TemplateID}, nil
	}
	w := hs.do(http.MethodPost, "/sandboxes", keyTeam1, `{"templateID":"base","iam":{"tokens":{"aws":{"audience":"sts.amazonaws.com","tokenType":"JWT-SVID"}}}}`)
	if w.Code != 201 || got == nil || got.Tokens["aws"] != (sandbox.IAMToken{Audience: "sts.amazonaws.com", TokenType: "JWT-SVID"}) {
		t.Errorf("create with iam: %d %s %+v", w.Code, w.Body, got)
	}
	w = hs.do(http.MethodPost, "/sandboxes", keyTeam1, `{"templateID":"base","iam":{"tokens":{}}}`)
	if w.Code != 201 || got != nil {
		t.Errorf("create with empty iam: %d %+v", w.Code, got)
	}
}
