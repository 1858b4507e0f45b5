package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/envdinfo"
)

// resolverFunc adapts a function to Resolver; nothing is ever paused.
type resolverFunc func(ctx context.Context, id string) (Target, error)

func (f resolverFunc) Resolve(ctx context.Context, id string) (Target, error) { return f(ctx, id) }
func (f resolverFunc) Resume(ctx context.Context, id string) error            { return nil }
func (f resolverFunc) Track(string, func()) (func(), error)                   { return func() {}, nil }
func (f resolverFunc) SignedBy(func(string) bool) (string, error)             { return "", ErrNotFound }

var loopback = netip.MustParseAddr("127.0.0.1")

// setup starts an upstream (standing in for a sandbox's port) and a proxy
// in front of it that knows sandbox "sbx1" at 127.0.0.1.
func setup(t *testing.T, upstream http.Handler, target Target) (proxyURL string, port int) {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	fmt.Sscan(u.Port(), &port)
	target.IP = loopback
	p := New(Config{Domain: "localhost", Resolver: resolverFunc(func(_ context.Context, id string) (Target, error) {
		switch id {
		case "sbx1":
			return target, nil
		case "moving":
			return Target{}, ErrTransitioning
		}
		return Target{}, fmt.Errorf("lookup: %w", ErrNotFound)
	})})
	ps := httptest.NewServer(p)
	t.Cleanup(ps.Close)
	return ps.URL, port
}

func do(t *testing.T, method, url, host string, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header
}

func echo() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "path=%s query=%s host=%s id=%q port=%q token=%q traffic=%q",
			r.URL.EscapedPath(), r.URL.RawQuery, r.Host, r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port"),
			r.Header.Get("X-Access-Token"), r.Header.Get("e2b-traffic-access-token"))
	})
}

func TestRoutesByHeadersAndByHost(t *testing.T) {
	pu, port := setup(t, echo(), Target{})
	status, body, _ := do(t, "GET", pu+"/files/a%2Fb?x=1&y=%2F", "", map[string]string{
		"E2b-Sandbox-Id": "sbx1", "E2b-Sandbox-Port": fmt.Sprint(port), "X-Access-Token": "tok",
	})
	want := fmt.Sprintf(`path=/files/a%%2Fb query=x=1&y=%%2F host=127.0.0.1:%s id="" port="" token="tok" traffic=""`, strings.TrimPrefix(pu, "http://127.0.0.1:"))
	if status != 200 || body != want {
		t.Errorf("by headers: %d %s\nwant %s", status, body, want)
	}
	host := fmt.Sprintf("%d-sbx1.localhost:3002", port)
	status, body, _ = do(t, "GET", pu+"/x", host, nil)
	if status != 200 || !strings.HasPrefix(body, "path=/x query= host="+host) {
		t.Errorf("by host: %d %s", status, body)
	}
}

func jsonBody(t *testing.T, body string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("not JSON: %q", body)
	}
	return m
}

func TestErrors(t *testing.T) {
	pu, port := setup(t, echo(), Target{})
	status, body, hdr := do(t, "GET", pu, "", map[string]string{"E2b-Sandbox-Id": "sbx1"})
	if status != 400 || !strings.Contains(body, "E2b-Sandbox-Port") || hdr.Get("Content-Type") != "application/json" {
		t.Errorf("one routing header: %d %s", status, body)
	}
	if status, body, _ = do(t, "GET", pu, "localhost", nil); status != 400 || jsonBody(t, body)["code"] != 400.0 {
		t.Errorf("no sandbox in host: %d %s", status, body)
	}
	status, body, _ = do(t, "GET", pu, fmt.Sprintf("%d-gone.localhost", port), nil)
	if m := jsonBody(t, body); status != 502 || m["sandboxId"] != "gone" || m["message"] != "The sandbox was not found" || m["code"] != 502.0 {
		t.Errorf("unknown sandbox: %d %s", status, body)
	}
	status, body, hdr = do(t, "GET", pu, fmt.Sprintf("%d-moving.localhost", port), nil)
	if status != 409 || jsonBody(t, body)["code"] != 409.0 || hdr.Get("Content-Type") != "application/json" {
		t.Errorf("transitioning: %d %s", status, body)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	status, body, _ = do(t, "GET", pu, fmt.Sprintf("%d-sbx1.localhost", closed), nil)
	if m := jsonBody(t, body); status != 502 || m["port"] != float64(closed) || m["message"] != "The sandbox is running but port is not open" {
		t.Errorf("closed port: %d %s", status, body)
	}
}

func TestTrafficTokenAndMaskedHost(t *testing.T) {
	pu, port := setup(t, echo(), Target{TrafficToken: "secret", MaskRequestHost: "localhost:${PORT}"})
	host := fmt.Sprintf("%d-sbx1.localhost", port)
	if status, body, _ := do(t, "GET", pu, host, nil); status != 403 || jsonBody(t, body)["code"] != 403.0 {
		t.Errorf("no traffic token: %d %s", status, body)
	}
	if status, _, _ := do(t, "GET", pu, host, map[string]string{"e2b-traffic-access-token": "wrong"}); status != 403 {
		t.Errorf("wrong traffic token: %d", status)
	}
	status, body, _ := do(t, "GET", pu, host, map[string]string{"e2b-traffic-access-token": "secret"})
	if status != 200 || !strings.Contains(body, fmt.Sprintf("host=localhost:%d ", port)) || !strings.HasSuffix(body, `traffic=""`) {
		t.Errorf("with the token: %d %s", status, body)
	}
}

func TestStreamsWithoutBuffering(t *testing.T) {
	release := make(chan struct{})
	pu, port := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A declared length: ReverseProxy flushes bodies of unknown length
		// at once whatever its FlushInterval, so only this proves ours.
		w.Header().Set("Content-Length", "13")
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "second\n")
	}), Target{})
	// Canceled first at cleanup, so a buffering proxy fails the test
	// rather than hanging it (not even the headers would come).
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", pu, nil)
	req.Host = fmt.Sprintf("%d-sbx1.localhost", port)
	var br *bufio.Reader
	got := make(chan string, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- err.Error()
			return
		}
		br = bufio.NewReader(res.Body)
		line, _ := br.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if line != "first\n" {
			t.Fatalf("first chunk %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first chunk did not arrive before the response ended: the proxy buffers")
	}
	release <- struct{}{}
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "second\n" {
		t.Errorf("after the first chunk: %q %v", rest, err)
	}
}

func TestWebSocketUpgrade(t *testing.T) {
	pu, port := setup(t, wsEcho, Target{})
	upgradeAndEcho(t, strings.TrimPrefix(pu, "http://"), fmt.Sprintf("%d-sbx1.localhost", port))
}

// wsEcho is an upstream that takes a WebSocket upgrade and echoes what
// comes after it.
var wsEcho = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "not an upgrade", 400)
		return
	}
	conn, rw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	rw.Flush()
	io.Copy(conn, rw) // echo
})

// upgradeAndEcho upgrades a connection to addr for host and checks that
// what it sends comes back (from wsEcho, through the proxy).
func upgradeAndEcho(t *testing.T, addr, host string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", res, err)
	}
	io.WriteString(conn, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Errorf("echo through the upgraded connection: %q %v", buf, err)
	}
}

// TestFullDuplex: an upstream that answers before it has read the whole
// request body (as a Connect stream does) must still get all of it, and
// the response must not break. Without full duplex, net/http drains the
// body itself once the proxy flushes the response headers.
func TestFullDuplex(t *testing.T) {
	pu, port := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		io.WriteString(w, "started\n")
		w.(http.Flusher).Flush()
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %q %v\n", b, err)
	}), Target{})
	pr, pw := io.Pipe()
	// Registered after setup's, so it runs first: on failure, end the
	// request body so the servers can close instead of hanging the test.
	t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF) })
	req, _ := http.NewRequest("POST", pu, pr)
	req.Host = fmt.Sprintf("%d-sbx1.localhost", port)
	req.ContentLength = 10
	done := make(chan *http.Response, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			close(done)
			return
		}
		done <- res
	}()
	io.WriteString(pw, "hello")
	var res *http.Response
	select {
	case res = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("no response headers before the body ended")
	}
	if res == nil {
		return
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	if line, _ := br.ReadString('\n'); line != "started\n" {
		t.Fatalf("first line %q", line)
	}
	go func() {
		io.WriteString(pw, "world")
		pw.Close()
	}()
	got := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if line != "got \"helloworld\" <nil>\n" {
			t.Errorf("upstream read %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Error("the rest of the body never reached the upstream")
	}
}

// TestTrafficTokenExemptsEnvd: envd's port skips the traffic token (the SDK
// authenticates to envd with its own token); no test can listen on it, so
// this checks the decision directly.
func TestTrafficTokenExemptsEnvd(t *testing.T) {
	for _, c := range []struct {
		port      int
		want, got string
		ok        bool
	}{
		{envdinfo.Port, "secret", "", true},
		{8080, "", "", true},
		{8080, "secret", "", false},
		{8080, "secret", "wrong", false},
		{8080, "secret", "secret", true},
	} {
		if ok := trafficAllowed(c.port, c.want, c.got); ok != c.ok {
			t.Errorf("trafficAllowed(%d, %q, %q) = %v", c.port, c.want, c.got, ok)
		}
	}
}
