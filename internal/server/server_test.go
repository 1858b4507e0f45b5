package server

import (
	"net"
	"os"
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

// Metrics never share the API's or the proxy's listener, whose clients
// are tenants: serve refuses before it opens anything else.
func TestMetricsAddrIsAListenerOfItsOwn(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ api, proxy, tls, metrics string }{
		{"127.0.0.1:0", "127.0.0.2:0", "", "127.0.0.1:0"},
		{"127.0.0.1:0", "127.0.0.2:0", "", "127.0.0.2:0"},
		{"127.0.0.1:0", "127.0.0.2:0", "127.0.0.3:0", "127.0.0.3:0"},
	} {
		cfg := Config{Runtime: "runsc", DataDir: dir, APIAddr: c.api, ProxyAddr: c.proxy, MetricsAddr: c.metrics}
		if c.tls != "" {
			cfg.ProxyTLSAddrs = []string{c.tls}
		}
		err := Run(t.Context(), cfg, nil)
		if err == nil || !strings.Contains(err.Error(), "--metrics-addr") || !strings.Contains(err.Error(), "own") {
			t.Errorf("serve with --metrics-addr %s (api %s, proxy %s, tls %q): %v", c.metrics, c.api, c.proxy, c.tls, err)
		}
	}
	// A taken port is a clear error too.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = Run(t.Context(), Config{Runtime: "runsc", DataDir: dir, APIAddr: "127.0.0.1:0", ProxyAddr: "127.0.0.1:0", MetricsAddr: ln.Addr().String()}, nil)
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Errorf("serve with a taken --metrics-addr: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("serve wrote %d entries in the data dir before refusing", len(entries))
	}
}
