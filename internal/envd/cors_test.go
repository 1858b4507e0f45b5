package envd

import (
	"net/http"
	"strings"
	"testing"
)

// TestCORS: preflights are answered without a token, as E2B's envd
// does; actual calls still need the token, and no answer ever allows
// credentials.
func TestCORS(t *testing.T) {
	srv, _ := newTestServer(t, "secret", false)
	pre, _ := http.NewRequest("OPTIONS", srv.URL+"/process.Process/Start", nil)
	pre.Header.Set("Origin", "https://dashboard.example")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Access-Control-Request-Headers", "content-type,x-access-token,connect-protocol-version")
	res, err := http.DefaultClient.Do(pre)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	h := res.Header
	if res.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "*" || h.Get("Access-Control-Allow-Methods") != "POST" ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "x-access-token") || h.Get("Access-Control-Max-Age") == "" {
		t.Errorf("preflight: %d %v", res.StatusCode, h)
	}
	if h.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("preflight allows credentials: %v", h)
	}
	// A method envd does not serve is not granted.
	pre.Header.Set("Access-Control-Request-Method", "TRACE")
	if res, err = http.DefaultClient.Do(pre); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("TRACE granted: %v", res.Header)
	}
	// The actual call: CORS headers, and the token still required.
	req, _ := http.NewRequest("GET", srv.URL+"/envs", nil)
	req.Header.Set("Origin", "https://dashboard.example")
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized || res.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(res.Header.Get("Access-Control-Expose-Headers"), "Grpc-Status") {
		t.Errorf("call without token: %d %v", res.StatusCode, res.Header)
	}
	req.Header.Set("X-Access-Token", "secret")
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("call with token: %d %v", res.StatusCode, res.Header)
	}
	// No Origin: no CORS headers.
	req.Header.Del("Origin")
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("same-origin call got CORS headers: %v", res.Header)
	}
}
