package proxy

import (
	"errors"
	"testing"
)

func TestFirstSignedAsksEveryCandidate(t *testing.T) {
	cands := []SignedCandidate{{"a", "ta"}, {"b", "tb"}, {"c", "tc"}}
	var asked []string
	id, err := FirstSigned(cands, func(tok string) bool { asked = append(asked, tok); return tok == "tb" })
	if err != nil || id != "b" {
		t.Fatalf("FirstSigned = %q, %v; want b", id, err)
	}
	if len(asked) != 3 {
		t.Errorf("asked %v: every candidate must be asked, whatever matched", asked)
	}
	if _, err := FirstSigned(cands, func(string) bool { return false }); !errors.Is(err, ErrNotFound) {
		t.Errorf("no match: err = %v, want ErrNotFound", err)
	}
}
