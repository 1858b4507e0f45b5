package reqid

import (
	"context"
	"regexp"
	"testing"
)

func TestNewAndContext(t *testing.T) {
	a, b := New(), New()
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(a) || a == b {
		t.Errorf("IDs %q, %q", a, b)
	}
	if got := FromContext(NewContext(context.Background(), a)); got != a {
		t.Errorf("FromContext: %q, want %q", got, a)
	}
	if got := FromContext(context.Background()); got != "" {
		t.Errorf("FromContext of a bare context: %q", got)
	}
}

// BenchmarkNameARequest is what naming each request costs the proxy: a
// fresh ID in the request's context.
func BenchmarkNameARequest(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		_ = NewContext(ctx, New())
	}
}
