package noderpc_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/proxy"
)

// A public client that sends a node's internal paths through the api's
// sandbox proxy reaches the node's sandbox traffic, never its RPC, image
// or platform handlers (issue 22's critical item).
func TestPublicProxyNeverReachesNodeInternals(t *testing.T) {
	auth, _ := cluster.NewAuth([]byte(strings.Repeat("r", 32)))
	reached := map[string]int{}
	named := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached[name]++
			io.WriteString(w, name)
		})
	}
	node := httptest.NewServer(noderpc.Handler(noderpc.Served{Sandboxes: nil, Traffic: named("traffic"),
		Platform: named("platform"), Images: named("images")}, auth.Guard("n1")))
	defer node.Close()
	nodeAddr := strings.TrimPrefix(node.URL, "http://")
	fwd := httptest.NewServer(proxy.NewForwarder(proxy.ForwardConfig{Domain: "localhost",
		Locate:    func(context.Context, string) (string, string, error) { return "n1", nodeAddr, nil },
		SignedBy:  func(func(string) bool) (string, error) { return "", proxy.ErrNotFound },
		Transport: noderpc.NewTransport(auth), ClientAddrHeader: noderpc.ClientAddrHeader}))
	defer fwd.Close()
	for _, path := range []string{"/warren.node.v1.NodeService/Connect", "/images/layers/abc", "/platform/templates", "/files"} {
		for _, byHost := range []bool{false, true} {
			req, _ := http.NewRequest("POST", fwd.URL+path, strings.NewReader(`{"teamId":"","sandboxId":"sbx1"}`))
			req.Header.Set("Content-Type", "application/json")
			if byHost {
				req.Host = "49983-sbx1.localhost"
			} else {
				req.Header.Set("E2b-Sandbox-Id", "sbx1")
				req.Header.Set("E2b-Sandbox-Port", "49983")
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || string(b) != "traffic" {
				t.Errorf("%s (by host %v): %d %q, want the sandbox traffic's answer", path, byHost, res.StatusCode, b)
			}
		}
	}
	if reached["platform"]+reached["images"] != 0 {
		t.Errorf("internal handlers reached: %v", reached)
	}
}
