package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/filesig"
)

// forwardSetup runs a Forwarder whose sandbox "sbx1" is on node, and
// "gone" on no node.
func forwardSetup(t *testing.T, node http.Handler) (string, *Forwarder) {
	t.Helper()
	ns := httptest.NewServer(node)
	t.Cleanup(ns.Close)
	f := NewForwarder(ForwardConfig{
		Domain: "localhost",
		Locate: func(ctx context.Context, id string) (string, string, error) {
			if id == "sbx1" {
				return "n1", strings.TrimPrefix(ns.URL, "http://"), nil
			}
			return "", "", ErrNotFound
		},
		SignedBy: func(signed func(string) bool) (string, error) {
			if signed("token1") {
				return "sbx1", nil
			}
			return "", ErrNotFound
		},
		Transport:        http.DefaultTransport,
		ClientAddrHeader: "Warren-Client-Addr",
	})
	fs := httptest.NewServer(f)
	t.Cleanup(fs.Close)
	return fs.URL, f
}

func TestForwardsToTheSandboxesNode(t *testing.T) {
	fu, _ := forwardSetup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(map[string]string{
			"host": r.Host, "id": r.Header.Get("E2b-Sandbox-Id"), "port": r.Header.Get("E2b-Sandbox-Port"),
			"client": r.Header.Get("Warren-Client-Addr"), "uri": r.RequestURI, "body": string(b),
		})
	}))
	req, _ := http.NewRequest("POST", fu+"/a/b?c=d", strings.NewReader("payload"))
	req.Host = "8000-sbx1.localhost"
	req.Header.Set("Warren-Client-Addr", "6.6.6.6:1") // a client's own is replaced
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got map[string]string
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got["host"] != "8000-sbx1.localhost" || got["id"] != "sbx1" || got["port"] != "8000" || got["uri"] != "/a/b?c=d" || got["body"] != "payload" {
		t.Errorf("the node got %v", got)
	}
	if !strings.HasPrefix(got["client"], "127.0.0.1:") {
		t.Errorf("client address %q, want the forwarder's client's", got["client"])
	}
}

func TestForwardErrors(t *testing.T) {
	fu, _ := forwardSetup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	get := func(host, path string) (int, string) {
		req, _ := http.NewRequest("GET", fu+path, nil)
		req.Host = host
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := get("8000-gone.localhost", "/"); code != http.StatusBadGateway || !strings.Contains(body, "The sandbox was not found") {
		t.Errorf("a sandbox on no node: %d %s", code, body)
	}
	if code, body := get("nohost", "/"); code != http.StatusBadRequest || !strings.Contains(body, "cannot tell the sandbox") {
		t.Errorf("no route: %d %s", code, body)
	}
	// A signed URL names no sandbox: the signature finds it.
	exp := time.Now().Add(time.Minute).Unix()
	sig := filesig.Signature("/f", filesig.Read, "", "token1", &exp)
	if code, _ := get("127.0.0.1", fmt.Sprintf("/files?path=/f&signature=%s&signature_expiration=%d", url.QueryEscape(sig), exp)); code != http.StatusOK {
		t.Errorf("a signed URL: %d", code)
	}
	// Wrong signatures spend the client's budget, then are refused.
	codes := map[int]int{}
	for range authFailureBurst + 2 {
		code, _ := get("127.0.0.1", "/files?path=/f&signature=v1_wrong")
		codes[code]++
	}
	if codes[http.StatusUnauthorized] != authFailureBurst || codes[http.StatusTooManyRequests] != 2 {
		t.Errorf("wrong signatures answered %v", codes)
	}
	// A genuine one from the same address is still served.
	if code, _ := get("127.0.0.1", fmt.Sprintf("/files?path=/f&signature=%s&signature_expiration=%d", url.QueryEscape(sig), exp)); code != http.StatusOK {
		t.Errorf("a signed URL after the budget is spent: %d", code)
	}
}

func TestForwardToADeadNode(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	f := NewForwarder(ForwardConfig{
		Domain:           "localhost",
		Locate:           func(context.Context, string) (string, string, error) { return "n1", addr, nil },
		SignedBy:         func(func(string) bool) (string, error) { return "", ErrNotFound },
		Transport:        http.DefaultTransport,
		ClientAddrHeader: "Warren-Client-Addr",
	})
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "http://8000-sbx1.localhost/", nil)
	f.ServeHTTP(w, r)
	if w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), "node did not answer") {
		t.Errorf("dead node: %d %s", w.Code, w.Body)
	}
}

func TestForwardsWebSockets(t *testing.T) {
	fu, _ := forwardSetup(t, wsEcho)
	upgradeAndEcho(t, strings.TrimPrefix(fu, "http://"), "8000-sbx1.localhost")
}

// A panic while a request is served is a 500 naming a request ID, in
// the proxy as in the forwarder; the server goes on.
func TestPanicsAreInternalErrors(t *testing.T) {
	p := New(Config{Domain: "localhost", Resolver: resolverFunc(func(context.Context, string) (Target, error) { panic("resolver bug") })})
	f := NewForwarder(ForwardConfig{Domain: "localhost", ClientAddrHeader: "Warren-Client-Addr",
		Locate:   func(context.Context, string) (string, string, error) { panic("locate bug") },
		SignedBy: func(func(string) bool) (string, error) { return "", ErrNotFound }})
	for name, h := range map[string]http.Handler{"proxy": p, "forwarder": f} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "http://8000-sbx1.localhost/", nil))
		if w.Code != http.StatusInternalServerError || w.Header().Get("X-Request-Id") == "" && !strings.Contains(w.Body.String(), "request") {
			t.Errorf("%s: %d %s", name, w.Code, w.Body)
		}
		if strings.Contains(w.Body.String(), "bug") {
			t.Errorf("%s: the panic's text reached the client: %s", name, w.Body)
		}
	}
}
