package filesig

import (
	"strconv"
	"testing"
	"time"
)

func TestSignedAndVerify(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	past, future := now.Unix()-10, now.Unix()+10
	q := func(op, token string, exp *int64) Query {
		s := ""
		if exp != nil {
			s = strconv.FormatInt(*exp, 10)
		}
		return Query{Path: "a.txt", Username: "root", Signature: Signature("a.txt", op, "root", token, exp), Expiration: s}
	}
	for _, tc := range []struct {
		name       string
		q          Query
		op, token  string
		signed     bool
		verifyWant string
	}{
		{"read, no expiry", q(Read, "tok", nil), Read, "tok", true, ""},
		{"valid until later", q(Write, "tok", &future), Write, "tok", true, ""},
		// Signed ignores the time; Verify says it expired only for a genuine one.
		{"expired", q(Read, "tok", &past), Read, "tok", true, "signature is already expired"},
		{"other token, expired", q(Read, "other", &past), Read, "tok", false, "invalid signature"},
		{"read signature used to write", q(Read, "tok", nil), Write, "tok", false, "invalid signature"},
		{"other user", Query{Path: "a.txt", Username: "user", Signature: Signature("a.txt", Read, "root", "tok", nil)}, Read, "tok", false, "invalid signature"},
		{"no signature", Query{Path: "a.txt"}, Read, "tok", false, "missing signature query parameter"},
		{"bad expiration", Query{Path: "a.txt", Signature: "v1_x", Expiration: "soon"}, Read, "tok", false, "invalid signature_expiration"},
		{"empty token never signs", q(Read, "", nil), Read, "", false, "invalid signature"},
	} {
		if got := tc.q.Signed(tc.op, tc.token); got != tc.signed {
			t.Errorf("%s: Signed = %v", tc.name, got)
		}
		err := tc.q.Verify(tc.op, tc.token, now)
		if (err == nil) != (tc.verifyWant == "") || err != nil && err.Error() != tc.verifyWant {
			t.Errorf("%s: Verify = %v, want %q", tc.name, err, tc.verifyWant)
		}
	}
}

func TestOperation(t *testing.T) {
	for m, want := range map[string]string{"GET": Read, "POST": Write, "PUT": "", "DELETE": "", "HEAD": ""} {
		if got := Operation(m); got != want {
			t.Errorf("Operation(%s) = %q", m, got)
		}
	}
}
