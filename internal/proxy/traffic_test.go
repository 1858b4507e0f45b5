package proxy

import (
	"bufio"
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

// sandboxApp stands in for what runs in a sandbox: /stream answers at once
// and never finishes, /wait never answers, an upgrade is echoed; all until
// the exchange is taken away.
func sandboxApp() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Upgrade") != "":
			wsEcho.ServeHTTP(w, r)
		case r.URL.Path == "/stream":
			io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case r.URL.Path == "/wait":
			<-r.Context().Done()
		default:
			echo().ServeHTTP(w, r)
		}
	})
}

// waitTracked waits (at most 5 s) until id has n exchanges tracked.
func waitTracked(t *testing.T, n *fakeNode, id string, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for n.tracked(id) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d exchanges tracked, want %d", id, n.tracked(id), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// within fails the test if fn has not returned 5 s after the kill: what
// a kill ends must end at once, not at a client's timeout.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s is still open 5 s after the kill", what)
	}
}

func get(t *testing.T, base, host, path string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", base+path, nil)
	req.Host = host
	req.Header.Set("E2b-Traffic-Access-Token", "traffic-"+strings.Split(strings.TrimPrefix(host, "8000-"), ".")[0])
	res, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestKillEndsExchanges: the end a sandbox's owner calls on kill (or
// pause) ends at once a stream under way, a request still waiting for its
// answer (502, the body of a gone sandbox) and an upgraded connection;
// another sandbox's stream carries on, and nothing stays tracked.
func TestKillEndsExchanges(t *testing.T) {
	n, p, _ := newFakeNodeWith(t, sandboxApp())
	ps := httptest.NewServer(p)
	defer ps.Close()

	stream := get(t, ps.URL, "8000-sbx1.localhost", "/stream")
	defer stream.Body.Close()
	other := get(t, ps.URL, "8000-sbx2.localhost", "/stream")
	defer other.Body.Close()
	br := bufio.NewReader(stream.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("stream: %q %v", line, err)
	}

	waiting := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("GET", ps.URL+"/wait", nil)
		req.Host = "8000-sbx1.localhost"
		req.Header.Set("E2b-Traffic-Access-Token", "traffic-sbx1")
		res, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Errorf("waiting request: %v", err)
		}
		waiting <- res
	}()

	ws, err := net.Dial("tcp", strings.TrimPrefix(ps.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	ws.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(ws, "GET /ws HTTP/1.1\r\nHost: 8000-sbx1.localhost\r\nE2b-Traffic-Access-Token: traffic-sbx1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	wsr := bufio.NewReader(ws)
	if res, err := http.ReadResponse(wsr, nil); err != nil || res.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", res, err)
	}
	io.WriteString(ws, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(wsr, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}

	waitTracked(t, n, "sbx1", 3)
	if ended := n.kill("sbx1"); ended != 3 {
		t.Fatalf("kill ended %d exchanges, want 3", ended)
	}
	// Each ends now, not when its client gives up (20 s).
	within(t, "the stream", func() {
		if rest, err := io.ReadAll(br); err == nil {
			t.Errorf("the stream ended cleanly after the kill (%q): the client cannot tell it from a finished one", rest)
		}
	})
	within(t, "the waiting request", func() {
		res := <-waiting
		if res == nil {
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 502 || !strings.Contains(string(body), `"message":"The sandbox was not found"`) || !strings.Contains(string(body), `"sandboxId":"sbx1"`) {
			t.Errorf("waiting request: %d %s", res.StatusCode, body)
		}
	})
	within(t, "the upgraded connection", func() {
		if _, err := io.ReadAll(wsr); err != nil {
			t.Errorf("upgraded connection: %v (want EOF)", err)
		}
	})
	waitTracked(t, n, "sbx1", 0)

	// sbx2 was not touched.
	if n.tracked("sbx2") != 1 {
		t.Errorf("sbx2's stream is no longer tracked")
	}
	if line, err := bufio.NewReader(other.Body).ReadString('\n'); err != nil || line != "first\n" {
		t.Errorf("sbx2's stream: %q %v", line, err)
	}
}

// TestSignedURLsFindTheirSandbox: a /files URL with a signature and no
// route goes to the sandbox whose envd token made it; anything else about
// a signature is "invalid signature" (401, no sandbox dialed), which
// spends the address's budget.
func TestSignedURLsFindTheirSandbox(t *testing.T) {
	n, p, _ := newFakeNodeWith(t, sandboxApp())
	ps := httptest.NewServer(p)
	defer ps.Close()
	future, past := time.Now().Add(time.Hour).Unix(), time.Now().Add(-time.Hour).Unix()
	signed := func(path, op, user, token string, exp *int64) string {
		v := url.Values{"path": {path}, "signature": {filesig.Signature(path, op, user, token, exp)}}
		if user != "" {
			v.Set("username", user)
		}
		if exp != nil {
			v.Set("signature_expiration", fmt.Sprint(*exp))
		}
		return "/files?" + v.Encode()
	}
	send := func(remote, method, target string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, target, strings.NewReader(""))
		r.Host = "127.0.0.1:3002"
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		return w
	}
	for _, c := range []struct {
		name, method, target string
		status               int
		dial                 string
	}{
		{"download signed by sbx2", "GET", signed("a.txt", "read", "", "envd-sbx2", nil), 200, "10.99.0.6:49983"},
		{"upload signed by sbx1 as root, expiring", "POST", signed("/root/a", "write", "root", "envd-sbx1", &future), 200, "10.99.0.2:49983"},
		// envd itself says it has expired: the signature is genuine.
		{"expired but genuine", "GET", signed("a.txt", "read", "", "envd-sbx1", &past), 200, "10.99.0.2:49983"},
		{"unknown token", "GET", signed("a.txt", "read", "", "envd-gone", nil), 401, ""},
		{"read signature to write", "POST", signed("a.txt", "read", "", "envd-sbx1", nil), 401, ""},
		{"write signature to read", "GET", signed("a.txt", "write", "", "envd-sbx1", nil), 401, ""},
		{"signed for another path", "GET", strings.Replace(signed("a.txt", "read", "", "envd-sbx1", nil), "a.txt", "b.txt", 1), 401, ""},
		{"signed for another user", "GET", signed("a.txt", "read", "", "envd-sbx1", nil) + "&username=root", 401, ""},
		{"expiration moved", "GET", strings.Replace(signed("a.txt", "read", "", "envd-sbx1", &past), fmt.Sprint(past), fmt.Sprint(future), 1), 401, ""},
		{"not /files", "GET", strings.Replace(signed("a.txt", "read", "", "envd-sbx1", nil), "/files", "/filesx", 1), 400, ""},
		{"another method", "PUT", signed("a.txt", "write", "", "envd-sbx1", nil), 400, ""},
		{"no signature", "GET", "/files?path=a.txt", 400, ""},
		{"broken query", "GET", "/files?path=%zz&signature=v1_x", 400, ""},
	} {
		w := send(fmt.Sprintf("192.0.2.%d:1", len(c.name)), c.method, c.target)
		dialed, _ := n.take()
		if w.Code != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, w.Code, w.Body.String(), c.status)
		}
		if c.dial == "" && len(dialed) > 0 || c.dial != "" && (len(dialed) != 1 || dialed[0] != c.dial) {
			t.Errorf("%s: dialed %v, want %q", c.name, dialed, c.dial)
		}
		if w.Code == 401 && strings.TrimSpace(w.Body.String()) != `{"code":401,"message":"invalid signature"}` {
			t.Errorf("%s: %s (the answer must not say which part failed)", c.name, w.Body.String())
		}
	}

	// Every candidate's token is tried, whatever matches first.
	n.mu.Lock()
	n.signedBy = 0
	n.mu.Unlock()
	send("192.0.2.200:1", "GET", signed("a.txt", "read", "", "envd-sbx1", nil))
	n.mu.Lock()
	if n.signedBy != 3 {
		t.Errorf("SignedBy offered %d tokens, want all 3", n.signedBy)
	}
	n.mu.Unlock()
	n.take()

	// Guessing spends the address's budget; then further guesses wait,
	// but a good one does not.
	const attacker = "198.51.100.9:1"
	for i := range authFailureBurst {
		if w := send(attacker, "GET", signed("a.txt", "read", "", fmt.Sprint("guess", i), nil)); w.Code != 401 {
			t.Fatalf("guess %d: %d", i, w.Code)
		}
	}
	if w := send(attacker, "GET", signed("a.txt", "read", "", "guess", nil)); w.Code != 429 {
		t.Errorf("a guess past the budget: %d", w.Code)
	}
	if w := send(attacker, "GET", signed("a.txt", "read", "", "envd-sbx1", nil)); w.Code != 200 {
		t.Errorf("a good signature past the budget: %d", w.Code)
	}
	n.take()
}

// TestSignedURLResumesAPausedSandbox: a genuine signature is a credential
// for envd's port, as its token is.
func TestSignedURLResumesAPausedSandbox(t *testing.T) {
	n, p, _ := newFakeNode(t)
	n.paused = true
	v := url.Values{"path": {"a.txt"}, "signature": {filesig.Signature("a.txt", "read", "", "envd-paused", nil)}}
	r := httptest.NewRequest("GET", "/files?"+v.Encode(), nil)
	r.Host = "127.0.0.1:3002"
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	dialed, resumed := n.take()
	// Resumed into another slot: reached at its new address.
	if w.Code != 200 || len(resumed) != 1 || len(dialed) != 1 || dialed[0] != "10.99.0.14:49983" {
		t.Errorf("%d %s, resumed %v, dialed %v", w.Code, w.Body.String(), resumed, dialed)
	}
}
