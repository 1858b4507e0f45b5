package cluster

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzCheck gives a node's guard arbitrary requests: it never panics and
// never takes one that was not signed with the secret (a MAC cannot be
// guessed; a random input that passed would be a bug in the parsing).
func FuzzCheck(f *testing.F) {
	a := newTestAuth(f, 'f')
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	good := signed(f, a, "POST", "http://node/warren.node.v1.NodeService/Connect?x=1", `{"teamId":""}`, PurposeRPC, "n1")
	f.Add("POST", "node", "/warren.node.v1.NodeService/Connect?x=1", good.Header.Get(AuthHeader), good.Header.Get(HeadersHeader), "Content-Type", "application/json", []byte(`{"teamId":""}`), true)
	f.Add("GET", "node", "/images/layers/x", "2.images.1800000000."+strings.Repeat("a", 32)+".0."+strings.Repeat("0", 64), "", "", "", []byte(nil), false)
	f.Add("GET", "", "/", "2.traffic.1800000000.zz.1.", "Content-Type,,X", "Warren-Client-Addr", "1.2.3.4:5", []byte("x"), true)
	f.Add("PUT", "h", "*", "1800000000.aa.bb", "a b", "E2b-Sandbox-Id", "x", []byte{}, false)
	f.Fuzz(func(t *testing.T, method, host, uri, auth, list, hname, hvalue string, body []byte, chunked bool) {
		u, err := url.ParseRequestURI(uri)
		if err != nil {
			u = &url.URL{Path: uri}
		}
		r := &http.Request{Method: method, Host: host, RequestURI: uri, URL: u, Header: http.Header{},
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
			Trailer: http.Header{BodyTrailer: {auth}}}
		if chunked {
			r.TransferEncoding, r.ContentLength = []string{"chunked"}, -1
		}
		r.Header[AuthHeader] = []string{auth}
		r.Header[HeadersHeader] = []string{list}
		if hname != "" {
			r.Header[hname] = []string{hvalue}
		}
		g := a.Guard("n1")
		if p, _, err := g.Check(r); err == nil {
			// Only the seed's own signature can pass, for its own request;
			// its body must then match at its end.
			if auth != good.Header.Get(AuthHeader) {
				t.Fatalf("an unsigned request was taken as %q", p)
			}
			if b, err := io.ReadAll(r.Body); err == nil && string(b) != `{"teamId":""}` {
				t.Fatalf("another body was taken: %q", b)
			}
		}
	})
}

// FuzzSignedHeaders signs requests with arbitrary headers and sends them
// over the wire format: what the node parses always checks (both sides
// MAC the same headers), and a changed value of a signed header never
// does.
func FuzzSignedHeaders(f *testing.F) {
	a := newTestAuth(f, 'g')
	f.Add("X-A", " v ", "x-a", "w", "Y", "z", []byte("body"))
	f.Add("user-agent", "", "User-Agent", "ua", "Cookie", "a=1\r\nb", []byte(nil))
	f.Add("Warren-Client-Addr", "1.2.3.4:5", "E2b-Sandbox-Id", "sbx", "Content-Type", "text/plain", []byte("{}"))
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string, body []byte) {
		var rd io.Reader
		if len(body) > 0 {
			rd = bytes.NewReader(body)
		}
		r, err := http.NewRequest("POST", "http://node/p?q=1", rd)
		if err != nil {
			t.Skip()
		}
		r.Header[k1] = []string{v1}
		r.Header[k2] = append(r.Header[k2], v2)
		r.Header.Add(k3, v3)
		if err := a.Sign(r, PurposeTraffic, "n1"); err != nil {
			return // too many headers: refused before sending
		}
		var buf bytes.Buffer
		if err := r.Write(&buf); err != nil {
			return // the HTTP client would not send it either
		}
		wire := buf.Bytes()
		parse := func(b []byte) *http.Request {
			got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
			if err != nil {
				return nil
			}
			return got
		}
		got := parse(wire)
		if got == nil {
			return // a server would refuse it before the guard
		}
		if _, b, err := readChecked(a.Guard("n1"), got); err != nil || string(b) != string(body) {
			t.Fatalf("a signed request did not check: %v (body %q)\n%q", err, b, wire)
		}
		// Every signed header's value, changed on the wire, is refused.
		for _, name := range strings.Split(r.Header.Get(HeadersHeader), ",") {
			if name == "" {
				continue
			}
			v := r.Header.Get(name)
			line := []byte("\r\n" + name + ": " + v + "\r\n")
			i := bytes.Index(wire, line)
			if i < 0 {
				continue
			}
			changed := append(append(append([]byte{}, wire[:i]...), []byte("\r\n"+name+": "+v+"x\r\n")...), wire[i+len(line):]...)
			if got := parse(changed); got != nil {
				if _, _, err := readChecked(a.Guard("n1"), got); err == nil {
					t.Fatalf("a changed %s was taken", name)
				}
			}
		}
	})
}
