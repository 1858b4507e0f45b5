package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// answersUnread is a sandbox app that answers a POST at once, its body
// unread, and closes the connection (Python's http.server refusing a
// method).
var answersUnread = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	w.WriteHeader(http.StatusNotImplemented)
	io.WriteString(w, "unsupported method")
})

// postsGetTheirAnswer POSTs n times to base with host and wants the app's
// own answer each time: never a cut connection or a proxy's 502.
func postsGetTheirAnswer(t *testing.T, base, host string, header http.Header) {
	t.Helper()
	for i := range 200 {
		req, _ := http.NewRequest("POST", base+"/warren.node.v1.NodeService/KillSandbox", strings.NewReader(`{"teamId":"","sandboxId":"x"}`))
		req.Host = host
		for k, v := range header {
			req.Header[k] = v
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusNotImplemented || string(b) != "unsupported method" {
			t.Fatalf("request %d: %d %q %v", i, res.StatusCode, b, err)
		}
	}
}

// An answer that starts before the request body ended closes the
// connection after it (duplex.go): without that, net/http read the next
// request while the transport still read the body, panicked and cut the
// answer.
func TestEarlyAnswerToAnUnreadBody(t *testing.T) {
	up := httptest.NewServer(answersUnread)
	defer up.Close()
	u, _ := url.Parse(up.URL)
	p := New(Config{Domain: "localhost", Resolver: resolverFunc(func(context.Context, string) (Target, error) {
		return Target{IP: loopback}, nil
	})})
	node := httptest.NewServer(p)
	defer node.Close()
	postsGetTheirAnswer(t, node.URL, "localhost", http.Header{"E2b-Sandbox-Id": {"sbx1"}, "E2b-Sandbox-Port": {u.Port()}})
}

// The same through an api's Forwarder and the node, signed both ways.
func TestEarlyAnswerToAnUnreadBodySigned(t *testing.T) {
	fu, port, _ := clusterSetup(t, answersUnread)
	postsGetTheirAnswer(t, fu, fmt.Sprintf("%d-sbx1.localhost", port), nil)
}
