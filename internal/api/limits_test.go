package api

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestTeamRateLimit(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	hs := newHarness(t, Config{RateLimit: 2, Now: clock.now}) // burst 4
	for i := range 4 {
		if w := hs.do("GET", "/sandboxes", keyTeam1, ""); w.Code != 200 {
			t.Fatalf("request %d within the burst: %d %s", i+1, w.Code, w.Body.String())
		}
	}
	w := hs.do("GET", "/sandboxes", keyTeam1, "")
	if code, msg := errorBody(t, w); code != 429 || !strings.Contains(msg, "rate limit") {
		t.Fatalf("past the burst: %d %q", code, msg)
	}
	if ra := w.Header().Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want whole seconds (1)", ra)
	}
	if n := len(hs.sandboxes.Calls()); n != 4 {
		t.Errorf("the manager was called %d times, want 4", n)
	}
	// Another team has its own bucket, and /health none.
	if w := hs.do("GET", "/sandboxes", keyTeam2, ""); w.Code != 200 {
		t.Errorf("another team: %d", w.Code)
	}
	if w := hs.do("GET", "/health", "", ""); w.Code != 200 {
		t.Errorf("health: %d", w.Code)
	}
	clock.advance(time.Second)
	if w := hs.do("GET", "/sandboxes", keyTeam1, ""); w.Code != 200 {
		t.Errorf("after a refill: %d", w.Code)
	}
}

func TestFailedAuthenticationsPerAddress(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	hs := newHarness(t, Config{Now: clock.now})
	const attacker, bystander = "198.51.100.7:4000", "198.51.100.8:4000"
	bad := "e2b_" + strings.Repeat("0", 40)
	for i := range authFailureBurst {
		if w := hs.doFrom(attacker, "GET", "/sandboxes", bad, ""); w.Code != 401 {
			t.Fatalf("failure %d: %d", i+1, w.Code)
		}
	}
	w := hs.doFrom(attacker, "GET", "/sandboxes", bad, "")
	if code, _ := errorBody(t, w); code != 429 || w.Header().Get("Retry-After") == "" {
		t.Fatalf("past the failure budget: %d, Retry-After %q", code, w.Header().Get("Retry-After"))
	}
	// Only failures are refused: a good key from there is served.
	if w := hs.doFrom(attacker, "GET", "/sandboxes", keyTeam1, ""); w.Code != 200 {
		t.Errorf("a good key from the blocked address: %d", w.Code)
	}
	// Missing credentials and bad upload signatures are refused too.
	if w := hs.doFrom(attacker, "GET", "/sandboxes", "", ""); w.Code != 429 {
		t.Errorf("no key from the blocked address: %d", w.Code)
	}
	w = hs.doFrom(attacker, "PUT", "/upload/templates/tpl1/files/"+strings.Repeat("a", 64)+"?expires=1&signature=bad", "", "x")
	if code, _ := errorBody(t, w); code != 429 || w.Header().Get("Retry-After") == "" {
		t.Errorf("a bad upload signature from the blocked address: %d %s", w.Code, w.Body.String())
	}
	if w := hs.doFrom(bystander, "GET", "/sandboxes", keyTeam1, ""); w.Code != 200 {
		t.Errorf("another address: %d", w.Code)
	}
	for range authFailureBurst {
		hs.doFrom(bystander, "PUT", "/upload/templates/tpl1/files/"+strings.Repeat("a", 64)+"?expires=1&signature=bad", "", "x")
	}
	if w := hs.doFrom(bystander, "GET", "/sandboxes", "", ""); w.Code != 429 {
		t.Errorf("after %d bad upload signatures: %d", authFailureBurst, w.Code)
	}
	clock.advance(2 * time.Second)
	if w := hs.doFrom(attacker, "GET", "/sandboxes", bad, ""); w.Code != 401 {
		t.Errorf("a bad key after the wait: %d", w.Code)
	}
}

// Behind a load balancer every client has its address: many failures
// from it (one tenant guessing, or misconfigured) must not lock the
// other tenants out. Their valid credentials are served; only further
// failures are refused.
func TestFailuresFromALoadBalancerDoNotRefuseValidKeys(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	hs := newHarness(t, Config{Now: clock.now})
	const lb = "10.0.0.2:51000"
	bad := "e2b_" + strings.Repeat("0", 40)
	for range 10 * authFailureBurst {
		hs.doFrom(lb, "GET", "/sandboxes", bad, "")
	}
	for i, key := range []string{keyTeam1, keyTeam2, keyTeam1} {
		if w := hs.doFrom(lb, "GET", "/sandboxes", key, ""); w.Code != 200 {
			t.Errorf("valid key %d through the load balancer: %d %s", i, w.Code, w.Body.String())
		}
	}
	if w := hs.doFrom(lb, "GET", "/sandboxes", bad, ""); w.Code != 429 || w.Header().Get("Retry-After") == "" {
		t.Errorf("a further failure: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}

func TestDiskReserve(t *testing.T) {
	free := int64(100)
	var statErr error
	hs := newHarness(t, Config{DiskReserveMB: 2048, FreeDiskMB: func() (int64, error) { return free, statErr }})
	hash := strings.Repeat("a", 64)
	requests := []struct{ method, path, body string }{
		{"POST", "/v2/templates/tpl1/builds/b1", `{"fromTemplate":"base"}`},
		{"POST", "/templates/tpl1", `{"dockerfile":"FROM base"}`},
		{"PUT", "/upload/templates/tpl1/files/" + hash + "?expires=9999999999&signature=good", "archive"},
	}
	for _, r := range requests {
		w := hs.do(r.method, r.path, keyTeam1, r.body)
		code, msg := errorBody(t, w)
		if code != http.StatusInsufficientStorage || !strings.Contains(msg, "2048") || !strings.Contains(msg, "100 MB free") {
			t.Errorf("%s %s with 100 MB free: %d %q", r.method, r.path, code, msg)
		}
	}
	if c := append(hs.sandboxes.Calls(), hs.templates.Calls()...); len(c) != 0 {
		t.Errorf("made something on a full disk: %v", c)
	}
	// Other requests go on; with room, these do too.
	if w := hs.do("GET", "/templates", keyTeam1, ""); w.Code != 200 {
		t.Errorf("a listing on a full disk: %d", w.Code)
	}
	free = 4096
	for _, r := range requests {
		if w := hs.do(r.method, r.path, keyTeam1, r.body); w.Code >= 300 {
			t.Errorf("%s %s with room: %d %s", r.method, r.path, w.Code, w.Body.String())
		}
	}
	statErr, free = errors.New("statfs: input/output error"), 1<<20
	if w := hs.do("POST", "/templates/tpl1", keyTeam1, `{"dockerfile":"FROM base"}`); w.Code != 500 {
		t.Errorf("free space unreadable: %d (must fail closed)", w.Code)
	}
}

// Sandboxes are made on a node's disk, not on the api's: a create, fork
// or snapshot is not judged by the free space the api's own data dir
// has (in a cluster, the api role's), but by the node that makes it,
// whose refusal (sandbox.ErrDiskFull) is a 507.
func TestSandboxDiskIsTheNodes(t *testing.T) {
	hs := newHarness(t, Config{DiskReserveMB: 2048, FreeDiskMB: func() (int64, error) { return 100, nil }})
	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		if w := hs.do("POST", path, keyTeam1, `{"templateID":"base"}`); w.Code != http.StatusCreated {
			t.Errorf("POST %s with the api's own disk full: %d %s, want it made by the node", path, w.Code, w.Body)
		}
	}
	diskFull := fmt.Errorf("%w: %w: the node's data disk has 10 MB free, less than the 2048 MB it keeps in reserve", sandbox.ErrNoCapacity, sandbox.ErrDiskFull)
	hs.sandboxes.create = func(sandbox.CreateRequest) (store.Sandbox, error) { return store.Sandbox{}, diskFull }
	w := hs.do("POST", "/sandboxes", keyTeam1, `{"templateID":"base"}`)
	if code, msg := errorBody(t, w); code != http.StatusInsufficientStorage || !strings.Contains(msg, "10 MB free") {
		t.Errorf("the node's disk below its reserve: %d %q, want 507", code, msg)
	}
}

func TestTemplateResourcesBoundedByTheNode(t *testing.T) {
	hs := newHarness(t, Config{NodeCPUs: 4, NodeMemoryMB: 8192})
	for _, c := range []struct {
		body, want string
		status     int
	}{
		{`{"name":"t","cpuCount":5}`, "more than this node has (4 CPUs)", 400},
		{`{"name":"t","memoryMB":262144}`, "more than this node has (8192 MB)", 400},
		{`{"name":"t","cpuCount":0}`, "at least 1", 400},
		{`{"name":"t","memoryMB":64}`, "at least 128", 400},
		{`{"name":"t","cpuCount":4,"memoryMB":8192}`, "", 202},
	} {
		for _, path := range []string{"/v3/templates", "/templates/tpl1"} {
			body := c.body
			if path == "/templates/tpl1" {
				body = strings.Replace(body, `"name":"t"`, `"dockerfile":"FROM base"`, 1)
			}
			w := hs.do("POST", path, keyTeam1, body)
			if w.Code != c.status {
				t.Errorf("%s %s: %d %s", path, body, w.Code, w.Body.String())
				continue
			}
			if c.status == 400 {
				if _, msg := errorBody(t, w); !strings.Contains(msg, c.want) {
					t.Errorf("%s %s: %q lacks %q", path, body, msg, c.want)
				}
			}
		}
	}
}

// trickle sends a request whose body comes in pieces over d, and returns
// the status, or an error when the server cut it.
func trickle(t *testing.T, addr, method, path string, body string, d time.Duration) (int, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Length: %d\r\n\r\n", method, path, keyTeam1, len(body))
	pieces := 4
	step := len(body) / pieces
	for i := range pieces {
		time.Sleep(d / time.Duration(pieces))
		end := (i + 1) * step
		if i == pieces-1 {
			end = len(body)
		}
		if _, err := io.WriteString(conn, body[i*step:end]); err != nil {
			return 0, err
		}
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

func TestServerTimeouts(t *testing.T) {
	hs := newHarness(t, Config{UploadTimeout: 10 * time.Second})
	srv := NewHTTPServer(hs.h, Timeouts{ReadHeader: 300 * time.Millisecond, Read: 400 * time.Millisecond, Write: 5 * time.Second})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	// A client that never finishes its headers is dropped.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: x\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := io.ReadAll(conn); err != nil || time.Since(start) > 4*time.Second {
		t.Errorf("a client stuck in its headers was not dropped: %v after %v", err, time.Since(start))
	}

	// A JSON body slower than the read timeout is cut...
	if status, err := trickle(t, addr, "POST", "/sandboxes", `{"templateID":"base","timeout":30}`, 1200*time.Millisecond); err == nil && status < 300 {
		t.Errorf("a slow JSON body was read to its end: %d", status)
	}
	// ...but an upload of the same pace gets its own, longer deadline.
	hash := strings.Repeat("b", 64)
	status, err := trickle(t, addr, "PUT", "/upload/templates/tpl1/files/"+hash+"?expires=9999999999&signature=good", strings.Repeat("x", 4000), 1200*time.Millisecond)
	if err != nil || status != http.StatusCreated {
		t.Errorf("a slow upload: %d %v", status, err)
	}
	if hs.templates.uploaded != 4000 {
		t.Errorf("the upload delivered %d bytes, want 4000", hs.templates.uploaded)
	}
	if srv.MaxHeaderBytes != DefaultMaxHeaderBytes || srv.IdleTimeout != DefaultIdleTimeout {
		t.Errorf("defaults not applied: %+v", srv)
	}
}
