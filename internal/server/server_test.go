package server

import (
	"strings"
	"testing"
)

func TestRuncNeedsInsecureRuntime(t *testing.T) {
	if err := checkRuntime("runc", false); err == nil || !strings.Contains(err.Error(), "--insecure-runtime") {
		t.Errorf("runc without --insecure-runtime: %v", err)
	}
	for _, c := range []struct {
		name     string
		insecure bool
	}{{"runc", true}, {"runsc", false}, {"runsc", true}} {
		if err := checkRuntime(c.name, c.insecure); err != nil {
			t.Errorf("%s, insecure %v: %v", c.name, c.insecure, err)
		}
	}
}

// serve refuses before it opens anything: no store, no listener (the
// addresses would fail at once, without a DNS lookup).
func TestServeRefusesRuncFirst(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Runtime: "runc", DataDir: dir, APIAddr: "no-port", ProxyAddr: "no-port"}
	err := Run(t.Context(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "--insecure-runtime") {
		t.Fatalf("serve --runtime runc: %v", err)
	}
}
