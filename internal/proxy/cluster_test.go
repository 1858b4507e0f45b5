package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/warren-sandbox/warren/internal/cluster"
)

// clusterSetup is an api's Forwarder in front of node "n1" (the cluster's
// authentication both ways), whose own Proxy reaches upstream as sandbox
// sbx1. purposes records the purpose each request reached the node with.
// testLogWriter sends a logger's lines to the test's log: why the
// forwarder answered 502 shows in a failure.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func clusterSetup(t *testing.T, upstream http.Handler) (fwdURL string, port int, purposes func() []cluster.Purpose) {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	fmt.Sscan(u.Port(), &port)
	auth, err := cluster.NewAuth([]byte(strings.Repeat("p", 32)))
	if err != nil {
		t.Fatal(err)
	}
	nodeProxy := New(Config{Domain: "localhost", Resolver: resolverFunc(func(_ context.Context, id string) (Target, error) {
		if id == "sbx1" {
			return Target{IP: loopback}, nil
		}
		return Target{}, ErrNotFound
	})})
	var mu sync.Mutex
	var seen []cluster.Purpose
	node := httptest.NewServer(auth.Guard("n1").Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, cluster.PurposeOf(r.Context()))
		mu.Unlock()
		nodeProxy.ServeHTTP(w, r)
	})))
	t.Cleanup(node.Close)
	f := NewForwarder(ForwardConfig{Domain: "localhost",
		Locate: func(_ context.Context, id string) (string, string, error) {
			return "n1", strings.TrimPrefix(node.URL, "http://"), nil
		},
		SignedBy:         func(func(string) bool) (string, error) { return "", ErrNotFound },
		Transport:        auth.Transport(NewTransport()), // as internal/server does
		ClientAddrHeader: "Warren-Client-Addr",
		Logger:           slog.New(slog.NewTextHandler(testLogWriter{t}, nil)),
	})
	fs := httptest.NewServer(f)
	t.Cleanup(fs.Close)
	return fs.URL, port, func() []cluster.Purpose {
		mu.Lock()
		defer mu.Unlock()
		return append([]cluster.Purpose(nil), seen...)
	}
}

// The Forwarder signs what it forwards as sandbox traffic for the
// sandbox's node, whatever the path: a node's internal paths reach the
// sandbox, body, length and all.
func TestForwardedRequestsAreTraffic(t *testing.T) {
	fu, port, purposes := clusterSetup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %d %s", r.Method, r.URL.RequestURI(), r.ContentLength, b)
	}))
	for _, path := range []string{"/warren.node.v1.NodeService/Connect", "/images/layers/x", "/platform/templates", "/a%2Fb?c=d"} {
		req, _ := http.NewRequest("POST", fu+path, strings.NewReader("payload"))
		req.Host = fmt.Sprintf("%d-sbx1.localhost", port)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if want := "POST " + path + " 7 payload"; res.StatusCode != 200 || string(b) != want {
			t.Errorf("%s: %d %q, want %q", path, res.StatusCode, b, want)
		}
	}
	for _, p := range purposes() {
		if p != cluster.PurposeTraffic {
			t.Errorf("a forwarded request reached the node as %q", p)
		}
	}
	if len(purposes()) != 4 {
		t.Errorf("the node saw %d requests", len(purposes()))
	}
}

func TestForwardsWebSocketsSigned(t *testing.T) {
	fu, port, _ := clusterSetup(t, wsEcho)
	upgradeAndEcho(t, strings.TrimPrefix(fu, "http://"), fmt.Sprintf("%d-sbx1.localhost", port))
}

// A sandbox that answers before it has read the whole body (a Connect
// stream) gets all of it through the api and the node: the body streams,
// its proof checked at its end.
func TestFullDuplexSigned(t *testing.T) {
	fu, port, _ := clusterSetup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		io.WriteString(w, "started\n")
		w.(http.Flusher).Flush()
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %q %v\n", b, err)
	}))
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", fu+"/stream", pr)
	req.Host = fmt.Sprintf("%d-sbx1.localhost", port)
	done := make(chan string, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- err.Error()
			return
		}
		defer res.Body.Close()
		b := make([]byte, 8)
		io.ReadFull(res.Body, b) // "started\n" before the body ends
		pw.Write([]byte("one "))
		pw.Write([]byte("two"))
		pw.Close()
		rest, _ := io.ReadAll(res.Body)
		done <- string(b) + string(rest)
	}()
	if got := <-done; got != "started\ngot \"one two\" <nil>\n" {
		t.Errorf("full duplex through the cluster: %q", got)
	}
}
