package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func newTestAuth(t testing.TB, c byte) *Auth {
	t.Helper()
	a, err := NewAuth([]byte(strings.Repeat(string(c), 32)))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// wire sends r as the HTTP client would and parses it as the server
// does: what a node's Check sees.
func wire(t testing.TB, r *http.Request) *http.Request {
	t.Helper()
	var buf bytes.Buffer
	if err := r.Write(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := http.ReadRequest(bufio.NewReader(&buf))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func signed(t testing.TB, a *Auth, method, url, body string, p Purpose, target string) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	if err := a.Sign(r, p, target); err != nil {
		t.Fatal(err)
	}
	return r
}

// readChecked is Check then the body read to its end (where it is
// verified).
func readChecked(g *Guard, r *http.Request) (Purpose, string, error) {
	p, _, err := g.Check(r)
	if err != nil {
		return "", "", err
	}
	b, err := io.ReadAll(r.Body)
	return p, string(b), err
}

func TestSignAndCheck(t *testing.T) {
	a := newTestAuth(t, 's')
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	g := a.Guard("n1")
	p, body, err := readChecked(g, wire(t, signed(t, a, "POST", "http://node/warren.node.v1.NodeService/KillSandbox?x=1", `{"a":1}`, PurposeRPC, "n1")))
	if err != nil || p != PurposeRPC || body != `{"a":1}` {
		t.Fatalf("a signed request: %q %q %v", p, body, err)
	}
	if _, _, err := readChecked(g, wire(t, signed(t, a, "GET", "http://node/files", "", PurposeTraffic, "n1"))); err != nil {
		t.Fatalf("a signed request without a body: %v", err)
	}
	other := newTestAuth(t, 't')
	other.now = a.now
	if _, _, err := readChecked(other.Guard("n1"), wire(t, signed(t, a, "GET", "http://node/x", "", PurposeRPC, "n1"))); err == nil {
		t.Error("another secret's guard took the request")
	}

	field := func(r *http.Request, i int) string { return strings.Split(r.Header.Get(AuthHeader), ".")[i] }
	setField := func(r *http.Request, i int, v string) {
		f := strings.Split(r.Header.Get(AuthHeader), ".")
		f[i] = v
		r.Header.Set(AuthHeader, strings.Join(f, "."))
	}
	cases := map[string]func(*http.Request){
		"no header":        func(r *http.Request) { r.Header.Del(AuthHeader) },
		"two headers":      func(r *http.Request) { r.Header.Add(AuthHeader, r.Header.Get(AuthHeader)) },
		"other path":       func(r *http.Request) { r.RequestURI = "/warren.node.v1.NodeService/CreateSandbox?x=1" },
		"other query":      func(r *http.Request) { r.RequestURI = "/warren.node.v1.NodeService/KillSandbox?x=2" },
		"other method":     func(r *http.Request) { r.Method = "PUT" },
		"other host":       func(r *http.Request) { r.Host = "elsewhere" },
		"other purpose":    func(r *http.Request) { setField(r, 1, string(PurposeTraffic)) },
		"version 1":        func(r *http.Request) { setField(r, 0, "1") },
		"no dot":           func(r *http.Request) { r.Header.Set(AuthHeader, "123") },
		"bad time":         func(r *http.Request) { setField(r, 2, "x") },
		"padded time":      func(r *http.Request) { setField(r, 2, "0"+field(r, 2)) },
		"other nonce":      func(r *http.Request) { setField(r, 3, strings.Repeat("0", 32)) },
		"no body flag":     func(r *http.Request) { setField(r, 4, "0") },
		"forged mac":       func(r *http.Request) { setField(r, 5, strings.Repeat("0", 64)) },
		"a signed header":  func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") },
		"fewer headers":    func(r *http.Request) { r.Header.Set(HeadersHeader, "") },
		"header list x2":   func(r *http.Request) { r.Header.Add(HeadersHeader, "Content-Type") },
		"header list dupe": func(r *http.Request) { r.Header.Set(HeadersHeader, r.Header.Get(HeadersHeader)+",Content-Type") },
		"time moved back":  func(r *http.Request) { setField(r, 2, strconv.FormatInt(now.Unix()-1, 10)) },
		"not chunked": func(r *http.Request) {
			r.TransferEncoding, r.ContentLength = nil, 7
		},
	}
	for name, spoil := range cases {
		r := wire(t, signed(t, a, "POST", "http://node/warren.node.v1.NodeService/KillSandbox?x=1", `{"a":1}`, PurposeRPC, "n1"))
		spoil(r)
		if _, _, err := readChecked(g, r); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
	// Another node's request.
	if _, _, err := readChecked(a.Guard("n2"), wire(t, signed(t, a, "GET", "http://node/x", "", PurposeRPC, "n1"))); err == nil {
		t.Error("a request for n1 was taken by n2")
	}

	// A captured header is good for authSkew only.
	for _, d := range []time.Duration{authSkew + time.Second, -authSkew - time.Second} {
		r := wire(t, signed(t, a, "GET", "http://node/x", "", PurposeRPC, "n1"))
		now = now.Add(d)
		if _, _, err := readChecked(g, r); err == nil {
			t.Errorf("a header %v away was taken", d)
		}
		now = now.Add(-d)
	}
	if _, err := NewAuth([]byte("short")); err == nil {
		t.Error("a short secret was taken")
	}
}

// A body is verified at its end: another body (or one cut short) is a
// read error, never io.EOF.
func TestCheckVerifiesTheBody(t *testing.T) {
	a := newTestAuth(t, 'b')
	g := a.Guard("n1")
	for name, spoil := range map[string]func([]byte) []byte{
		"other body":  func(b []byte) []byte { return bytes.Replace(b, []byte(`"a":1`), []byte(`"a":2`), 1) },
		"longer body": func(b []byte) []byte { return bytes.Replace(b, []byte("7\r\n{\"a\":1}"), []byte("8\r\n{\"a\":12}"), 1) },
		"no trailer":  func(b []byte) []byte { return append(b[:bytes.LastIndex(b, []byte(BodyTrailer))], "\r\n"...) },
		"other trailer": func(b []byte) []byte {
			i := bytes.LastIndex(b, []byte(BodyTrailer)) + len(BodyTrailer) + 3
			b[i] ^= 1
			return b
		},
	} {
		r := signed(t, a, "POST", "http://node/x", `{"a":1}`, PurposeTraffic, "n1")
		var buf bytes.Buffer
		if err := r.Write(&buf); err != nil {
			t.Fatal(err)
		}
		got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(spoil(buf.Bytes()))))
		if err != nil {
			t.Fatal(err)
		}
		if _, body, err := readChecked(g, got); err == nil {
			t.Errorf("%s: taken (%q)", name, body)
		}
	}
	// A body's announced length comes back as its Content-Length.
	r := wire(t, signed(t, a, "POST", "http://node/x", `{"a":1}`, PurposeTraffic, "n1"))
	if r.ContentLength != -1 {
		t.Fatalf("the body did not travel chunked: %d", r.ContentLength)
	}
	if _, _, err := g.Check(r); err != nil || r.ContentLength != 7 || r.Header.Get("Content-Length") != "7" {
		t.Errorf("the body's length: %d %q %v", r.ContentLength, r.Header.Get("Content-Length"), err)
	}
}

func TestReplayIsRefused(t *testing.T) {
	a := newTestAuth(t, 'r')
	g := a.Guard("n1")
	r := signed(t, a, "POST", "http://node/warren.node.v1.NodeService/KillSandbox", `{}`, PurposeRPC, "n1")
	var buf bytes.Buffer
	if err := r.Write(&buf); err != nil {
		t.Fatal(err)
	}
	captured := buf.Bytes()
	for i, want := range []bool{true, false, false} {
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(captured)))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := readChecked(g, r); (err == nil) != want {
			t.Errorf("sending %d: %v", i+1, err)
		}
	}
}

// Unsigned headers never reach the handler: a man in the middle (or a
// public client, through a proxy that signs what it forwards) cannot
// add internal ones.
func TestUnlistedHeadersAreDropped(t *testing.T) {
	a := newTestAuth(t, 'u')
	r := wire(t, signed(t, a, "GET", "http://node/x", "", PurposeTraffic, "n1"))
	r.Header.Set("Warren-Client-Addr", "6.6.6.6:1")
	r.Header.Set("E2b-Sandbox-Id", "victim")
	r.Header.Set("X-Other", "y")
	if _, _, err := a.Guard("n1").Check(r); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"Warren-Client-Addr", "E2b-Sandbox-Id", "X-Other", AuthHeader, HeadersHeader} {
		if r.Header.Get(h) != "" {
			t.Errorf("%s reached the handler", h)
		}
	}
	if r.Header.Get("Content-Type") != "application/json" {
		t.Error("a signed header was dropped")
	}
	// A caller's own authentication headers are replaced when signing.
	in, _ := http.NewRequest("GET", "http://node/x", nil)
	in.Header.Set(HeadersHeader, "X-Evil")
	in.Header.Set("Warren-Cluster-Whatever", "1")
	if err := a.Sign(in, PurposeTraffic, "n1"); err != nil {
		t.Fatal(err)
	}
	if in.Header.Get(HeadersHeader) != "" || in.Header.Get("Warren-Cluster-Whatever") != "" {
		t.Errorf("a caller's cluster headers were passed on: %v", in.Header)
	}
}

func TestNonceCache(t *testing.T) {
	var c nonceCache
	now := time.Unix(1_800_000_000, 0)
	a, b, cc := [16]byte{'a'}, [16]byte{'b'}, [16]byte{'c'}
	if !c.add(now.Unix(), a, now) || c.add(now.Unix(), a, now) {
		t.Fatal("a nonce was taken twice")
	}
	if !c.add(now.Unix()-30, a, now) {
		t.Error("the same nonce at another time was refused")
	}
	// Forgotten only once its time is out of the window.
	later := now.Add(authSkew + 2*nonceBucket*time.Second)
	c.add(later.Unix(), b, later)
	if c.n != 1 || len(c.buckets) != 1 {
		t.Errorf("old nonces kept: %d in %d buckets", c.n, len(c.buckets))
	}
	c.n = maxNonces
	if c.add(later.Unix(), cc, later) {
		t.Error("a full cache took a nonce")
	}
}

// roundTripFunc is a man in the middle (or an impostor node).
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func client(a *Auth, base http.RoundTripper, p Purpose, target string) *http.Client {
	return &http.Client{Transport: Bind(a.Transport(base), p, target)}
}

func TestServeAndTransport(t *testing.T) {
	a := newTestAuth(t, 'k')
	node := httptest.NewServer(a.Guard("n1").Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Purpose", string(PurposeOf(r.Context())))
		w.Header().Set("X-Seen-Internal", r.Header.Get("Warren-Injected"))
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if n == 0 {
			fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.RequestURI(), b)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(bytes.Repeat([]byte("x"), n))
	})))
	defer node.Close()

	get := func(c *http.Client, method, path, body string) (*http.Response, string, error) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, node.URL+path, rd)
		res, err := c.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return res, string(b), err
	}
	c := client(a, nil, PurposePlatform, "n1")
	res, body, err := get(c, "POST", "/a%2Fb?q=1", "payload")
	if err != nil || res.StatusCode != 200 || body != "POST /a%2Fb?q=1 payload" || res.Header.Get("X-Purpose") != "platform" {
		t.Fatalf("a signed exchange: %v %q %v", res, body, err)
	}
	if res.Header.Get(AuthHeader) != "" || res.Header.Get(HeadersHeader) != "" || res.ContentLength != int64(len(body)) {
		t.Errorf("the answer's proof went on, or its length was lost: %v", res.Header)
	}
	// A long answer streams, its Content-Length kept.
	res, body, err = get(c, "GET", "/?n=100000", "")
	if err != nil || len(body) != 100000 || res.ContentLength != 100000 || res.Header.Get("Content-Length") != "100000" || len(res.Trailer) != 0 {
		t.Fatalf("a long answer: %v %d %v", res, len(body), err)
	}
	// No purpose or target: not sent.
	if _, _, err := get(&http.Client{Transport: a.Transport(nil)}, "GET", "/", ""); err == nil {
		t.Error("a request without purpose and target was sent")
	}

	// A man in the middle on the request's way.
	mitm := func(change func(*http.Request)) *http.Client {
		return client(a, roundTripFunc(func(r *http.Request) (*http.Response, error) {
			change(r)
			return http.DefaultTransport.RoundTrip(r)
		}), PurposePlatform, "n1")
	}
	for name, change := range map[string]func(*http.Request){
		"other query": func(r *http.Request) { r.URL.RawQuery = "q=2" },
		"other host":  func(r *http.Request) { r.Host = "other" },
		"other path":  func(r *http.Request) { r.URL.Path = "/c" },
		"other purpose": func(r *http.Request) {
			r.Header.Set(AuthHeader, strings.Replace(r.Header.Get(AuthHeader), ".platform.", ".traffic.", 1))
		},
	} {
		if _, _, err := get(mitm(change), "POST", "/a?q=1", "payload"); err == nil || !errors.Is(err, ErrAnswerUnauthenticated) {
			t.Errorf("%s: %v", name, err)
		}
	}
	res, body, err = get(mitm(func(r *http.Request) { r.Body = flipFirst{r.Body} }), "POST", "/a?q=1", "payload")
	if err != nil || res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "does not match") {
		t.Errorf("another body: %v %q %v", res, body, err)
	}
	res, _, err = get(mitm(func(r *http.Request) { r.Header.Set("Warren-Injected", "1") }), "GET", "/", "")
	if err != nil || res.Header.Get("X-Seen-Internal") != "" {
		t.Errorf("an unlisted header: %v %v", res, err)
	}
	if _, _, err := get(client(a, nil, PurposePlatform, "n2"), "GET", "/", ""); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("another target: %v", err)
	}

	// A man in the middle on the answer's way.
	answer := func(change func(*http.Response)) *http.Client {
		return client(a, roundTripFunc(func(r *http.Request) (*http.Response, error) {
			res, err := http.DefaultTransport.RoundTrip(r)
			if err == nil {
				change(res)
			}
			return res, err
		}), PurposePlatform, "n1")
	}
	if _, _, err := get(answer(func(res *http.Response) { res.StatusCode = 500 }), "GET", "/", ""); !errors.Is(err, ErrAnswerUnauthenticated) {
		t.Errorf("a forged status: %v", err)
	}
	if _, _, err := get(answer(func(res *http.Response) { res.Header.Set("X-Purpose", "rpc") }), "GET", "/", ""); !errors.Is(err, ErrAnswerUnauthenticated) {
		t.Errorf("a forged header: %v", err)
	}
	if _, _, err := get(answer(func(res *http.Response) { res.Body = flipFirst{res.Body} }), "GET", "/", ""); !errors.Is(err, ErrAnswerUnauthenticated) {
		t.Errorf("a tampered short body: %v", err)
	}
	res, _, err = get(answer(func(res *http.Response) { res.Header.Set("Set-Cookie", "x=1") }), "GET", "/", "")
	if err != nil || res.Header.Get("Set-Cookie") != "" {
		t.Errorf("an unlisted answer header: %v %v", res, err)
	}
	// A long body is checked at its end: the data read, then an error.
	res, body, err = get(answer(func(res *http.Response) { res.Body = flipFirst{res.Body} }), "GET", "/?n=100000", "")
	if err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("a tampered long body: %d bytes, %v", len(body), err)
	}
	// An impostor without the secret.
	impostor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(AuthHeader, "2.b."+strings.Repeat("0", 64))
		w.Write([]byte("trust me"))
	}))
	defer impostor.Close()
	req, _ := http.NewRequest("GET", impostor.URL, nil)
	if _, err := c.Do(req); !errors.Is(err, ErrAnswerUnauthenticated) {
		t.Errorf("an impostor's answer: %v", err)
	}
}

// flipFirst changes the first byte of a body on its way.
type flipFirst struct{ io.ReadCloser }

func (f flipFirst) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if n > 0 {
		p[0] ^= 1
	}
	return n, err
}

// An answer is bound to its request: replayed to another, it proves
// nothing.
func TestAnswerIsBoundToItsRequest(t *testing.T) {
	a := newTestAuth(t, 'a')
	var first *http.Response
	node := httptest.NewServer(a.Guard("n1").Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	defer node.Close()
	replaying := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		res, err := http.DefaultTransport.RoundTrip(r)
		if err != nil || first == nil {
			first = res
			return res, err
		}
		res.Body.Close()
		b, _ := io.ReadAll(first.Body)
		first.Body = io.NopCloser(bytes.NewReader(b))
		return first, nil
	})
	c := client(a, replaying, PurposeRPC, "n1")
	for i, ok := range []bool{true, false} {
		res, err := c.Get(node.URL)
		if (err == nil) != ok {
			t.Errorf("answer %d: %v", i+1, err)
		}
		if err == nil {
			res.Body.Close()
		}
	}
}

// A protocol switch is signed head only; the bytes after it pass.
func TestSwitchingProtocols(t *testing.T) {
	a := newTestAuth(t, 'w')
	node := httptest.NewServer(a.Guard("n1").Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		res := &http.Response{StatusCode: 101, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{"Upgrade": {"echo"}, "Connection": {"Upgrade"}}}
		res.Write(brw)
		brw.Flush()
		line, _ := bufio.NewReader(conn).ReadString('\n')
		conn.Write([]byte("echo " + line))
	})))
	defer node.Close()
	req, _ := http.NewRequestWithContext(WithTarget(WithPurpose(context.Background(), PurposeTraffic), "n1"), "GET", node.URL, nil)
	req.Header.Set("Upgrade", "echo")
	req.Header.Set("Connection", "Upgrade")
	res, err := a.Transport(nil).RoundTrip(req)
	if err != nil || res.StatusCode != 101 {
		t.Fatalf("switch: %v %v", res, err)
	}
	rw := res.Body.(io.ReadWriteCloser)
	defer rw.Close()
	rw.Write([]byte("hi\n"))
	b, _ := bufio.NewReader(rw).ReadString('\n')
	if b != "echo hi\n" {
		t.Errorf("after the switch: %q", b)
	}
}
