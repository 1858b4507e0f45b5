package server

import (
	"net"
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

// The exports name the volume content API too: the SDK would look for it
// at https://api.DOMAIN, and Warren serves it on the API's address.
func TestExportsNameTheVolumeAPI(t *testing.T) {
	var out strings.Builder
	api := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 3000}
	proxy := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 3002}
	printExports(&out, Config{DataDir: "/d", Domain: "localhost"}, api, proxy, nil, nil, nil)
	for _, want := range []string{"export E2B_API_URL=http://127.0.0.1:3000\n", "export E2B_SANDBOX_URL=http://127.0.0.1:3002\n",
		"export E2B_VOLUME_API_URL=http://127.0.0.1:3000\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the exports lack %q:\n%s", want, out.String())
		}
	}
}
