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
