package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/team"
)

// A create's iam is checked as E2B's API checks it, and a rule may use
// only the tokens it names.
func TestIAMChecks(t *testing.T) {
	tok := func(aud, typ string) IAMToken { return IAMToken{Audience: aud, TokenType: typ} }
	rule := func(v string) *Network {
		return &Network{Rules: map[string][]egress.Rule{"api.example.com": {{Transform: &egress.Transform{Headers: map[string]string{"Authorization": v}}}}}}
	}
	six := map[string]IAMToken{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		six[n] = tok("x", "JWT-SVID")
	}
	for _, tc := range []struct {
		iam  *IAM
		n    *Network
		want string // "" ok
	}{
		{nil, nil, ""},
		{&IAM{Tokens: map[string]IAMToken{"aws": tok("sts.amazonaws.com", "JWT-SVID")}}, rule("Bearer ${e2b.identity.tokens.aws}"), ""},
		{&IAM{Tokens: map[string]IAMToken{"aws": tok("sts.amazonaws.com", "JWT-SVID")}}, nil, ""},
		{&IAM{Tokens: map[string]IAMToken{"aws": tok("", "JWT-SVID")}}, nil, "audience is required"},
		{&IAM{Tokens: map[string]IAMToken{"aws": tok("a", "jwt-svid")}}, nil, `only "JWT-SVID"`},
		{&IAM{Tokens: map[string]IAMToken{"": tok("a", "JWT-SVID")}}, nil, "token name"},
		{&IAM{Tokens: map[string]IAMToken{"a}b": tok("a", "JWT-SVID")}}, nil, "'}'"},
		{&IAM{Tokens: six}, nil, "too many tokens"},
		{&IAM{Tokens: map[string]IAMToken{"aws": tok("a", "JWT-SVID")}}, rule("${e2b.identity.tokens.gcp}"), "not in the sandbox's iam.tokens"},
		{nil, rule("${e2b.identity.tokens.aws}"), "not in the sandbox's iam.tokens"},
	} {
		_, err := compileEgress(tc.n, tc.iam, "t1", nil, nil)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("iam %+v: %v, want %q", tc.iam, err, tc.want)
		}
	}
	p, err := compileEgress(rule("${e2b.identity.tokens.aws}"), &IAM{Tokens: map[string]IAMToken{"aws": tok("sts", "JWT-SVID")}}, "t1", nil, nil)
	if err != nil || p.Identity["aws"] != "sts" || len(p.Identity) != 1 {
		t.Errorf("policy identity %v %v", p.Identity, err)
	}
}

// A network update may use only the tokens the create named (the record
// keeps them); a sandbox created without iam gets none from an update.
func TestUpdateNetworkKeepsIAM(t *testing.T) {
	m, _ := bareManager(t)
	err := m.UpdateNetwork(context.Background(), team.MustParse("t1"), "sb1", NetworkUpdate{
		Rules: map[string][]egress.Rule{"api.example.com": {{Transform: &egress.Transform{Headers: map[string]string{"X": "${e2b.identity.tokens.aws}"}}}}},
	})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "iam.tokens") {
		t.Errorf("update with a token the create did not name: %v", err)
	}
}
