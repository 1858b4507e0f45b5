package proxy

import (
	"net/http"
	"strconv"
	"testing"
)

// TestCORSOnProxyErrors: a page calling a sandbox (E2B's browser SDK)
// can read the proxy's own error answers (no credentials allowed), while
// a sandbox's own answers keep exactly the CORS headers it set.
func TestCORSOnProxyErrors(t *testing.T) {
	url, port := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "https://app.example")
		w.Header().Set("Access-Control-Allow-Credentials", "true")
		w.WriteHeader(http.StatusTeapot)
	}), Target{})
	origin := map[string]string{"Origin": "https://page.example"}
	status, _, h := do(t, "GET", url, "49983-gone.localhost", origin)
	if status != http.StatusBadGateway || h.Get("Access-Control-Allow-Origin") != "*" || h.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("gone sandbox: %d %v", status, h)
	}
	status, _, h = do(t, "GET", url, "not-a-sandbox-host", origin)
	if status != http.StatusBadRequest || h.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("bad route: %d %v", status, h)
	}
	status, _, h = do(t, "GET", url, portHost(port), origin)
	if status != http.StatusTeapot || len(h.Values("Access-Control-Allow-Origin")) != 1 || h.Get("Access-Control-Allow-Origin") != "https://app.example" {
		t.Errorf("sandbox's answer: %d %v", status, h)
	}
	// Without an Origin: none.
	if _, _, h = do(t, "GET", url, "49983-gone.localhost", nil); h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("no Origin: %v", h)
	}
}

func portHost(port int) string { return strconv.Itoa(port) + "-sbx1.localhost" }

// TestPreflightThatNamesNoSandbox: with E2B_SANDBOX_URL the browser SDK
// calls one address for every sandbox and routes by E2b-Sandbox-Id, which
// a preflight never carries: the proxy answers it with envd's CORS grant
// (no credentials), and the actual request is routed and checked as any.
func TestPreflightThatNamesNoSandbox(t *testing.T) {
	url, _ := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the sandbox got a %s", r.Method)
	}), Target{})
	preflight := map[string]string{"Origin": "https://page.example", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "content-type,e2b-sandbox-id,e2b-sandbox-port,x-access-token"}
	status, _, h := do(t, "OPTIONS", url, "127.0.0.1", preflight)
	if status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "*" || h.Get("Access-Control-Allow-Methods") != "POST" ||
		h.Get("Access-Control-Allow-Headers") != preflight["Access-Control-Request-Headers"] || h.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("preflight: %d %v", status, h)
	}
	// A method envd does not serve gets no grant.
	preflight["Access-Control-Request-Method"] = "TRACE"
	if status, _, h = do(t, "OPTIONS", url, "127.0.0.1", preflight); status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("TRACE preflight: %d %v", status, h)
	}
	// An OPTIONS that is no preflight (no Origin) is still refused as unroutable.
	if status, _, _ = do(t, "OPTIONS", url, "127.0.0.1", map[string]string{"Access-Control-Request-Method": "POST"}); status != http.StatusBadRequest {
		t.Errorf("OPTIONS without Origin: %d", status)
	}
}
