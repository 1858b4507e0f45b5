package cluster

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/warren-sandbox/warren/internal/cluster"
	nodev1 "github.com/warren-sandbox/warren/proto/node/v1"
	"github.com/warren-sandbox/warren/proto/node/v1/nodev1connect"
)

// internalRequests are what a node serves for itself, as an attacker
// would send them through the public proxy: NodeService calls naming the
// victim (and no team, which matched any), the image and platform routes.
func internalRequests(victimTeam, victimID, decoyID string) []struct{ method, path, body string } {
	return []struct{ method, path, body string }{
		{"POST", nodev1connect.NodeServiceConnectProcedure, fmt.Sprintf(`{"teamId":%q,"sandboxId":%q,"timeoutMs":60000}`, victimTeam, victimID)},
		{"POST", nodev1connect.NodeServiceConnectProcedure, fmt.Sprintf(`{"teamId":"","sandboxId":%q,"timeoutMs":60000}`, victimID)},
		{"POST", nodev1connect.NodeServiceCreateSandboxProcedure, fmt.Sprintf(`{"teamId":%q,"templateId":"base","timeoutMs":86400000}`, victimTeam)},
		{"POST", nodev1connect.NodeServiceKillSandboxProcedure, fmt.Sprintf(`{"teamId":"","sandboxId":%q}`, decoyID)},
		{"POST", nodev1connect.NodeServiceUpdateNetworkProcedure, fmt.Sprintf(`{"teamId":%q,"sandboxId":%q,"updateJson":"{\"AllowOut\":[\"198.18.0.1\"]}"}`, victimTeam, victimID)},
		{"GET", "/images/layers/" + "base", ""},
		{"GET", "/images/", ""},
		{"GET", "/platform/templates", ""},
	}
}

// leaked reports whether an answer carries what only a node's internals
// give: the victim's envd token, a sandbox record, a Connect answer.
func leaked(r response, victimToken string) string {
	switch {
	case victimToken != "" && bytes.Contains(r.body, []byte(victimToken)):
		return "the victim's envd access token"
	case bytes.Contains(r.body, []byte("sandboxJson")):
		return "a NodeService answer"
	case r.status == http.StatusOK && strings.HasPrefix(r.header.Get("Content-Type"), "application/json") && !bytes.Contains(r.body, []byte("victim-app")):
		return "a JSON answer of the node's own"
	case r.status == http.StatusOK && (strings.Contains(r.header.Get("Content-Type"), "tar") || strings.Contains(r.header.Get("Content-Type"), "octet-stream")):
		return "an image's bytes"
	}
	return ""
}

// TestInternalPathsThroughThePublicProxy: the api's sandbox proxy
// forwards a sandbox's traffic to its node; no path or header of it may
// reach the node's RPC, image or platform handlers, on either api, on the
// HTTP and the HTTPS listener, routed by header or by host. The victim's
// own web app, which serves /images/x and /platform/x, gets those paths.
func TestInternalPathsThroughThePublicProxy(t *testing.T) {
	// The kill is aimed at a decoy of the victim's team, so that a kill
	// that gets through leaves the victim to the other cases.
	decoy, err := C.createOn(context.Background(), C.nodes[0].name, C.teamA, 300)
	if err != nil {
		t.Fatal(err)
	}
	defer C.call(context.Background(), C.teamA, "DELETE", "/sandboxes/"+decoy.ID, nil)
	before := C.snapshot(t)
	// Sandboxes an attack made are killed, so that they do not fill the
	// nodes for the next cases.
	defer func() {
		for _, tm := range []team{C.teamA, C.teamB} {
			ids, _ := C.sandboxIDs(context.Background(), tm)
			for _, id := range ids {
				if !slices.Contains(before.teams[tm.id], id) {
					C.call(context.Background(), tm, "DELETE", "/sandboxes/"+id, nil)
				}
			}
		}
	}()
	// The HTTPS listener's certificate is its own (self-signed): the
	// client names the sandbox's host in SNI, as a browser would.
	tlsClient := func(port int) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true,
			ServerName: fmt.Sprintf("%d-%s.localhost", port, C.victim.ID)}}}
	}
	for _, api := range C.apis {
		for _, listener := range []struct {
			name, base string
		}{{"http", api.proxyURL}, {"https", "https://" + api.tlsAddr}} {
			for _, port := range []int{envdPort, appPort} {
				client := http.DefaultClient
				if listener.name == "https" {
					client = tlsClient(port)
				}
				for _, routing := range []string{"header", "host"} {
					for _, rq := range internalRequests(C.teamA.id, C.victim.ID, decoy.ID) {
						name := fmt.Sprintf("%s %s port %d by %s: %s %s", api.name, listener.name, port, routing, rq.method, rq.path)
						var body io.Reader
						if rq.body != "" {
							body = strings.NewReader(rq.body)
						}
						req, err := http.NewRequest(rq.method, listener.base+rq.path, body)
						if err != nil {
							t.Fatal(err)
						}
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("X-Access-Token", "")
						if routing == "header" {
							req.Header.Set("E2b-Sandbox-Id", C.victim.ID)
							req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
						} else {
							req.Host = fmt.Sprintf("%d-%s.localhost", port, C.victim.ID)
						}
						r, err := do(client, req)
						if err != nil {
							t.Errorf("%s: %v", name, err)
							continue
						}
						if what := leaked(r, C.victim.EnvdToken); what != "" {
							t.Errorf("%s reached the node: the answer carries %s: %s", name, what, r)
						}
					}
					// The victim's app answers its own paths.
					if port == appPort {
						for _, path := range []string{"/images/x", "/platform/x"} {
							req, _ := http.NewRequest("GET", listener.base+path, nil)
							if routing == "header" {
								req.Header.Set("E2b-Sandbox-Id", C.victim.ID)
								req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
							} else {
								req.Host = fmt.Sprintf("%d-%s.localhost", port, C.victim.ID)
							}
							r, err := do(client, req)
							if err != nil || r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != "victim-app" {
								t.Errorf("%s %s by %s: the sandbox's own app did not answer GET %s: %v %s", api.name, listener.name, routing, path, err, r)
							}
						}
					}
				}
			}
		}
	}
	C.untouched(t, before)
}

// mitm sits between a client and a node: it passes the requests on byte
// for byte, and records them; it reads the node's answers and may change
// them (their bodies decoded when compressed, and encoded again) before
// it writes them on.
type mitm struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	log    []*http.Request // each request, its body read (and trailers)
	// rewrite, if set, changes each answer (status and decoded body)
	// that only (if set) matches; the others pass as they came.
	rewrite func(res *http.Response, body []byte) []byte
	only    func(res *http.Response) bool
}

func newMITM(t *testing.T, target string) *mitm {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &mitm{ln: ln, target: target}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.carry(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

func (p *mitm) carry(c net.Conn) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	// Requests: verbatim to the node, and parsed on the side.
	pr, pw := io.Pipe()
	go func() {
		io.Copy(up, io.TeeReader(c, pw))
		pw.Close()
		up.(*net.TCPConn).CloseWrite()
	}()
	go func() {
		br := bufio.NewReader(pr)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				io.Copy(io.Discard, pr)
				return
			}
			b, _ := io.ReadAll(req.Body) // the trailers are read with it
			req.Body = io.NopCloser(bytes.NewReader(b))
			p.mu.Lock()
			p.log = append(p.log, req)
			p.mu.Unlock()
		}
	}()
	br := bufio.NewReader(up)
	for {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			return
		}
		p.mu.Lock()
		rw, only := p.rewrite, p.only
		p.mu.Unlock()
		if rw != nil && (only == nil || only(res)) {
			body, _ := io.ReadAll(res.Body)
			gz := res.Header.Get("Content-Encoding") == "gzip"
			if gz {
				if zr, err := gzip.NewReader(bytes.NewReader(body)); err == nil {
					body, _ = io.ReadAll(zr)
				}
			}
			body = rw(res, body)
			if gz {
				var out bytes.Buffer
				zw := gzip.NewWriter(&out)
				zw.Write(body)
				zw.Close()
				body = out.Bytes()
			}
			// Chunked, so that the answer's trailers (if any) go on too.
			res.Body = io.NopCloser(bytes.NewReader(body))
			res.ContentLength, res.TransferEncoding = -1, []string{"chunked"}
			res.Header.Del("Content-Length")
		}
		if err := res.Write(c); err != nil {
			return
		}
	}
}

func (p *mitm) addr() string { return p.ln.Addr().String() }

func (p *mitm) setRewrite(rw func(*http.Response, []byte) []byte) {
	p.setRewriteOf(nil, rw)
}

// setRewriteOf has rw change only the answers only matches: a buffered
// answer (its body in its MAC, its Content-Length kept) that another
// rewrite would send chunked stays as it was.
func (p *mitm) setRewriteOf(only func(*http.Response) bool, rw func(*http.Response, []byte) []byte) {
	p.mu.Lock()
	p.rewrite, p.only = rw, only
	p.mu.Unlock()
}

// captured returns the recorded requests to path.
func (p *mitm) captured(path string) []*http.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*http.Request
	for _, r := range p.log {
		if r.URL.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// throughProxy points the apis at node n through a proxy of the test's
// for the rest of the test.
func throughProxy(t *testing.T, n *proc) *mitm {
	t.Helper()
	p := newMITM(t, n.nodeAddr)
	setAddress(t, n.name, p.addr())
	t.Cleanup(func() { setAddress(t, n.name, n.nodeAddr); time.Sleep(apisSeeNodesAfter) })
	time.Sleep(apisSeeNodesAfter)
	return p
}

func setAddress(t *testing.T, node, addr string) {
	t.Helper()
	ctx := context.Background()
	n, err := C.st.GetNode(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	n.Address = addr
	if err := C.st.RegisterNode(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// TestReplayedInternalRequest: a request an api signed, captured on the
// network between it and a node, is refused when sent again with another
// body or another query (here: to give the victim a day more).
func TestReplayedInternalRequest(t *testing.T) {
	ctx := context.Background()
	own, err := C.createOn(ctx, C.nodes[0].name, C.teamB, 120)
	if err != nil {
		t.Fatal(err)
	}
	defer C.call(ctx, C.teamB, "DELETE", "/sandboxes/"+own.ID, nil)
	before := C.snapshot(t)
	rec := throughProxy(t, C.nodes[0])
	if r, err := C.call(ctx, C.teamB, "POST", "/sandboxes/"+own.ID+"/timeout", map[string]any{"timeout": 100}); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("the attacker's own timeout: %v %s", err, r)
	}
	reqs := rec.captured(nodev1connect.NodeServiceSetTimeoutProcedure)
	if len(reqs) == 0 {
		t.Fatalf("captured no SetTimeout between the api and the node")
	}
	orig := reqs[0]
	origBody, _ := io.ReadAll(orig.Body)
	forged, err := proto.Marshal(&nodev1.SetTimeoutRequest{TeamId: C.teamA.id, SandboxId: C.victim.ID, TimeoutMs: 23 * 3600 * 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, query string
		body        []byte
	}{
		{"another body", "", forged},
		{"another body and query", "?replayed=1", forged},
		{"another query", "?replayed=1", origBody},
	} {
		req, err := http.NewRequest(orig.Method, "http://"+C.nodes[0].nodeAddr+orig.URL.Path+c.query, bytes.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range orig.Header {
			req.Header[k] = v
		}
		req.Header.Del("Content-Length")
		if len(orig.Trailer) > 0 { // a body's proof goes in trailers: sent as captured
			req.Trailer = orig.Trailer.Clone()
			req.ContentLength = -1
			req.Body = io.NopCloser(bytes.NewReader(c.body))
		}
		r, err := do(http.DefaultClient, req)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if r.status < 400 {
			dump, _ := httputil.DumpRequest(req, false)
			t.Errorf("a captured request replayed with %s was accepted: %s\n%s", c.name, r, dump)
		}
	}
	C.untouched(t, before)
}

// TestForgedNodeAnswer: a man in the middle between an api and a node
// changes the node's answers (the victim's envd token in a Connect
// answer replaced, or the status replaced): the api refuses the answer
// rather than hand it on.
func TestForgedNodeAnswer(t *testing.T) {
	ctx := context.Background()
	before := C.snapshot(t)
	mitm := throughProxy(t, C.nodes[0])
	forgedToken := strings.Repeat("f", len(C.victim.EnvdToken))
	for _, c := range []struct {
		name    string
		rewrite func(*http.Response, []byte) []byte
		forged  string // what the client must not see
	}{
		{"the token replaced", func(_ *http.Response, b []byte) []byte {
			return bytes.ReplaceAll(b, []byte(C.victim.EnvdToken), []byte(forgedToken))
		}, forgedToken},
		{"a field changed", func(_ *http.Response, b []byte) []byte {
			return bytes.ReplaceAll(b, []byte(`"TemplateID":"base"`), []byte(`"TemplateID":"evil"`))
		}, `"evil"`},
		{"the status replaced", func(res *http.Response, b []byte) []byte {
			if res.StatusCode == http.StatusOK {
				res.StatusCode, res.Status = http.StatusNotFound, "404 Not Found"
				res.Header.Set("Warren-Error-Kind", "not_found")
				res.Header.Set("Content-Type", "application/json")
				return []byte(`{"code":"not_found","message":"sandbox not found: forged"}`)
			}
			return b
		}, "forged"},
	} {
		mitm.setRewrite(c.rewrite)
		n := len(mitm.captured(nodev1connect.NodeServiceConnectProcedure))
		r, err := C.call(ctx, C.teamA, "POST", "/sandboxes/"+C.victim.ID+"/connect", map[string]any{"timeout": 3600})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if len(mitm.captured(nodev1connect.NodeServiceConnectProcedure)) == n {
			t.Fatalf("%s: the api's Connect did not pass the man in the middle", c.name)
		}
		t.Logf("%s: the api answered %s", c.name, r)
		if bytes.Contains(r.body, []byte(c.forged)) {
			t.Errorf("%s: the api handed on a forged answer: %s", c.name, r)
		}
		if r.status < 300 && !bytes.Contains(r.body, []byte(C.victim.EnvdToken)) {
			t.Errorf("%s: the api answered %s without the victim's own token", c.name, r)
		}
	}
	mitm.setRewrite(nil)
	// The connect gave the victim an hour from now: its end moved, and
	// nothing else of it.
	after, err := C.st.GetSandbox(ctx, C.victim.ID)
	if err != nil {
		t.Fatal(err)
	}
	before.victim.EndAt = after.EndAt
	C.untouched(t, before)
}

// TestNodeRefusesCallsWithoutAKnownTeam: a NodeService call signed with
// the cluster secret (as by an api), naming no team or a team that does
// not exist, is refused on every procedure, and changes nothing.
func TestNodeRefusesCallsWithoutAKnownTeam(t *testing.T) {
	before := C.snapshot(t)
	a, err := cluster.NewAuth(C.secret)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range C.nodes {
		client := nodev1connect.NewNodeServiceClient(&http.Client{Transport: cluster.Bind(a.Transport(nil), cluster.PurposeRPC, n.name)}, "http://"+n.nodeAddr)
		for _, tm := range []string{"", "no-such-team"} {
			for name, call := range map[string]func() error{
				"Connect": func() error {
					res, err := client.Connect(ctx, connect.NewRequest(&nodev1.ConnectRequest{TeamId: tm, SandboxId: C.victim.ID, TimeoutMs: 60000}))
					if err == nil && strings.Contains(res.Msg.SandboxJson, C.victim.EnvdToken) {
						t.Errorf("node %s Connect with team %q gave the victim's envd token", n.name, tm)
					}
					return err
				},
				"CreateSandbox": func() error {
					_, err := client.CreateSandbox(ctx, connect.NewRequest(&nodev1.CreateSandboxRequest{TeamId: tm, TemplateId: "base", TimeoutMs: 60000}))
					return err
				},
				"SetTimeout": func() error {
					_, err := client.SetTimeout(ctx, connect.NewRequest(&nodev1.SetTimeoutRequest{TeamId: tm, SandboxId: C.victim.ID, TimeoutMs: 23 * 3600 * 1000}))
					return err
				},
				"UpdateNetwork": func() error {
					_, err := client.UpdateNetwork(ctx, connect.NewRequest(&nodev1.UpdateNetworkRequest{TeamId: tm, SandboxId: C.victim.ID, UpdateJson: `{"AllowOut":["198.18.0.1"]}`}))
					return err
				},
				"Logs": func() error {
					_, err := client.Logs(ctx, connect.NewRequest(&nodev1.LogsRequest{TeamId: tm, SandboxId: C.victim.ID}))
					return err
				},
				"Metrics": func() error {
					_, err := client.Metrics(ctx, connect.NewRequest(&nodev1.MetricsRequest{TeamId: tm, SandboxId: C.victim.ID}))
					return err
				},
				"Fork": func() error {
					_, err := client.Fork(ctx, connect.NewRequest(&nodev1.ForkRequest{TeamId: tm, SandboxId: C.victim.ID, TimeoutMs: 60000, Count: 1}))
					return err
				},
			} {
				err := call()
				if err == nil {
					t.Errorf("node %s accepted %s with team %q", n.name, name, tm)
					continue
				}
				if code := connect.CodeOf(err); code != connect.CodeInvalidArgument && code != connect.CodeNotFound {
					t.Errorf("node %s %s with team %q: %v, want invalid_argument or not_found", n.name, name, tm, err)
				}
			}
		}
	}
	C.untouched(t, before)
}
