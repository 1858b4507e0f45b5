package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
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

// Over HTTP/2 an early answer keeps the connection: each request is a
// stream of its own, and closing would end the others (GOAWAY).
func TestEarlyAnswerOverHTTP2KeepsTheConnection(t *testing.T) {
	up := httptest.NewServer(answersUnread)
	defer up.Close()
	u, _ := url.Parse(up.URL)
	p := New(Config{Domain: "localhost", Resolver: resolverFunc(func(context.Context, string) (Target, error) {
		return Target{IP: loopback}, nil
	})})
	node := httptest.NewUnstartedServer(p)
	node.EnableHTTP2 = true
	node.StartTLS()
	defer node.Close()
	client := node.Client()
	reused := 0
	for i := range 5 {
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
			if info.Reused {
				reused++
			}
		}}
		// The body is still open when the answer comes.
		pr, pw := io.Pipe()
		go pw.Write([]byte("body"))
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "POST", node.URL+"/x", pr)
		req.Header.Set("E2b-Sandbox-Id", "sbx1")
		req.Header.Set("E2b-Sandbox-Port", u.Port())
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		pw.Close()
		if res.ProtoMajor != 2 || res.StatusCode != http.StatusNotImplemented {
			t.Fatalf("request %d: HTTP/%d %d", i, res.ProtoMajor, res.StatusCode)
		}
	}
	if reused != 4 {
		t.Errorf("%d of 4 later requests reused the HTTP/2 connection", reused)
	}
}
