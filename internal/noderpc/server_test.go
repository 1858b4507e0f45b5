package noderpc

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/cluster"
	nodev1 "github.com/warren-sandbox/warren/proto/node/v1"
	"github.com/warren-sandbox/warren/proto/node/v1/nodev1connect"

	"connectrpc.com/connect"
)

// handlerSetup serves a node "n1" whose traffic, platform and images
// handlers say who they are, its NodeService on sbx.
func handlerSetup(t *testing.T, sbx Sandboxes) (*httptest.Server, *cluster.Auth) {
	t.Helper()
	auth, err := cluster.NewAuth([]byte(strings.Repeat("h", 32)))
	if err != nil {
		t.Fatal(err)
	}
	traffic := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "traffic "+r.URL.Path+" "+r.RemoteAddr)
	})
	platform := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "platform "+r.URL.Path+" "+r.RemoteAddr)
	})
	images := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "images "+r.URL.Path+" "+r.Header.Get(ClientAddrHeader))
	})
	srv := httptest.NewServer(Handler(Served{Sandboxes: sbx, Teams: fakeTeams{"t1": true}, Traffic: traffic, Platform: platform, Images: images}, auth.Guard("n1")))
	t.Cleanup(srv.Close)
	return srv, auth
}

func TestHandlerGuardsTheNode(t *testing.T) {
	srv, auth := handlerSetup(t, nil)
	do := func(c *http.Client, method, path string, h map[string]string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		res, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	as := func(p cluster.Purpose) *http.Client {
		return &http.Client{Transport: cluster.Bind(auth.Transport(nil), p, "n1")}
	}
	if code, body := do(http.DefaultClient, "GET", "/health", nil); code != 200 || body != "ok\n" {
		t.Errorf("health: %d %q", code, body)
	}
	for _, path := range []string{"/warren.node.v1.NodeService/KillSandbox", "/files", "/", "/templates", "/images/layers/x"} {
		if code, _ := do(http.DefaultClient, "POST", path, map[string]string{"Content-Type": "application/json", ClientAddrHeader: "1.2.3.4:5"}); code != http.StatusUnauthorized {
			t.Errorf("unsigned %s: %d", path, code)
		}
	}
	// Signed traffic is the node proxy's, as from the client the api named.
	if code, body := do(as(cluster.PurposeTraffic), "GET", "/files", map[string]string{ClientAddrHeader: "1.2.3.4:5"}); code != 200 || body != "traffic /files 1.2.3.4:5" {
		t.Errorf("signed traffic: %d %q", code, body)
	}
	// Platform requests keep their path.
	if code, body := do(as(cluster.PurposePlatform), "GET", "/templates", map[string]string{ClientAddrHeader: "1.2.3.4:5"}); code != 200 || body != "platform /templates 1.2.3.4:5" {
		t.Errorf("signed platform: %d %q", code, body)
	}
	// An image pull is not told of a client address.
	if code, body := do(as(cluster.PurposeImages), "GET", "/images/layers/x", map[string]string{ClientAddrHeader: "1.2.3.4:5"}); code != 200 || body != "images /images/layers/x " {
		t.Errorf("signed images: %d %q", code, body)
	}
	// A signed /health is traffic too (envd's /health in a sandbox).
	if code, body := do(as(cluster.PurposeTraffic), "GET", "/health", map[string]string{ClientAddrHeader: "1.2.3.4:5"}); code != 200 || body != "traffic /health 1.2.3.4:5" {
		t.Errorf("signed /health: %d %q", code, body)
	}
	// Another node's requests are refused here.
	other := &http.Client{Transport: cluster.Bind(auth.Transport(nil), cluster.PurposeTraffic, "n2")}
	if code, _ := do(other, "GET", "/files", nil); code != 0 {
		t.Errorf("a request for another node: %d", code)
	}
}

// The purpose decides, never the path: traffic for NodeService's path is
// the sandbox's, and an RPC-purpose request for a traffic path is no
// traffic (NodeService has no such route).
func TestHandlerRoutesByPurposeOnly(t *testing.T) {
	srv, auth := handlerSetup(t, failing{err: nil})
	for _, path := range []string{"/warren.node.v1.NodeService/Connect", "/warren.node.v1.NodeService/KillSandbox", "/images/layers/abc", "/templates"} {
		c := &http.Client{Transport: cluster.Bind(auth.Transport(nil), cluster.PurposeTraffic, "n1")}
		res, err := c.Post(srv.URL+path, "application/json", strings.NewReader(`{"teamId":"","sandboxId":"sbx1"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.HasPrefix(string(b), "traffic "+path+" ") {
			t.Errorf("traffic for %s: %d %q", path, res.StatusCode, b)
		}
	}
	c := &http.Client{Transport: cluster.Bind(auth.Transport(nil), cluster.PurposeRPC, "n1")}
	res, err := c.Get(srv.URL + "/files")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound || strings.Contains(string(b), "traffic") {
		t.Errorf("an rpc-purpose request for /files: %d %q", res.StatusCode, b)
	}
	// And the RPC itself works signed as one.
	rpc := nodev1connect.NewNodeServiceClient(c, srv.URL)
	if _, err := rpc.KillSandbox(context.Background(), connect.NewRequest(&nodev1.KillSandboxRequest{TeamId: "t1", SandboxId: "sbx1"})); err != nil {
		t.Errorf("a signed kill: %v", err)
	}
}
