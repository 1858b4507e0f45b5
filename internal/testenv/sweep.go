package testenv

import (
	"sync"
	"testing"
)

var swept sync.Map

// SweepOnce runs sweep the first time this test process asks for key (a
// network prefix, a runtime state dir): it removes what an earlier test
// run that was killed left under those names. Only the first use is
// swept, so what this run leaks stays for the leak checks to see.
func SweepOnce(t testing.TB, key string, sweep func() error) {
	t.Helper()
	if _, done := swept.LoadOrStore(key, true); done {
		return
	}
	if err := sweep(); err != nil {
		t.Fatalf("removing what an earlier run left under %s: %v", key, err)
	}
}
