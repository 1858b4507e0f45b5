package noderpc

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/cluster"
)

func TestHandlerGuardsTheNode(t *testing.T) {
	auth, err := cluster.NewAuth([]byte(strings.Repeat("h", 32)))
	if err != nil {
		t.Fatal(err)
	}
	traffic := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.RemoteAddr+" "+r.Header.Get(ClientAddrHeader))
	})
	platform := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "platform "+r.URL.Path+" "+r.RemoteAddr)
	})
	images := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "images "+r.URL.Path) })
	srv := httptest.NewServer(Handler(Served{Traffic: traffic, Platform: platform, Images: images}, auth))
	defer srv.Close()
	do := func(c *http.Client, method, path string, h map[string]string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	plain := http.DefaultClient
	signed := &http.Client{Transport: auth.Transport(nil)}
	if code, body := do(plain, "GET", "/health", nil); code != 200 || body != "ok\n" {
		t.Errorf("health: %d %q", code, body)
	}
	for _, path := range []string{"/warren.node.v1.NodeService/KillSandbox", "/files", "/", "/platform/templates", "/images/layers/x"} {
		if code, _ := do(plain, "POST", path, map[string]string{"Content-Type": "application/json", ClientAddrHeader: "1.2.3.4:5"}); code != http.StatusUnauthorized {
			t.Errorf("unsigned %s: %d", path, code)
		}
	}
	// Signed traffic is the node proxy's, as from the client the api named.
	if code, body := do(signed, "GET", "/files", map[string]string{ClientAddrHeader: "1.2.3.4:5"}); code != 200 || body != "1.2.3.4:5 " {
		t.Errorf("signed traffic: %d %q", code, body)
	}
	if code, body := do(signed, "GET", "/platform/templates", map[string]string{ClientAddrHeader: "1.2.3.4:5"}); code != 200 || body != "platform /templates 1.2.3.4:5" {
		t.Errorf("signed platform: %d %q", code, body)
	}
	if code, body := do(signed, "GET", "/images/layers/x", nil); code != 200 || body != "images /images/layers/x" {
		t.Errorf("signed images: %d %q", code, body)
	}
	// A signed /health is traffic too (envd's /health in a sandbox).
	if code, body := do(signed, "GET", "/health", map[string]string{ClientAddrHeader: "1.2.3.4:5"}); code != 200 || body != "1.2.3.4:5 " {
		t.Errorf("signed /health: %d %q", code, body)
	}
}
