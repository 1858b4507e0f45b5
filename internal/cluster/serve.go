package cluster

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Guard is a node's side of the authentication: it takes requests signed
// for this node only, each once, and signs its answers.
type Guard struct {
	a      *Auth
	node   string
	nonces nonceCache
}

// Guard returns the guard of the node named node.
func (a *Auth) Guard(node string) *Guard {
	return &Guard{a: a, node: node}
}

// errUnauthenticated is what a request without a valid signature gets;
// it does not say which part failed.
var errUnauthenticated = errors.New("cluster authentication failed")

// Check verifies r's signature: made with the secret for this node, for
// r's method, Host, target and signed headers, within authSkew of now,
// its nonce not seen before. It returns the signed purpose and the
// request's MAC. Then it makes r what was signed: unsigned headers are
// dropped (but Content-Length), a body announced with LengthHeader gets
// its Content-Length back, and a body is verified at its end (a mismatch
// is a read error, never io.EOF). r must be the request the HTTP server
// made (its body writes the trailer there).
func (g *Guard) Check(r *http.Request) (Purpose, []byte, error) {
	vs := r.Header.Values(AuthHeader)
	if len(vs) != 1 {
		return "", nil, errUnauthenticated
	}
	f := strings.Split(vs[0], ".")
	if len(f) != 6 || f[0] != authVersion {
		return "", nil, errUnauthenticated
	}
	purpose, ts, nonce, flag := Purpose(f[1]), f[2], f[3], f[4]
	if !purpose.Valid() || (flag != "0" && flag != "1") || len(nonce) != 32 || len(ts) > 12 {
		return "", nil, errUnauthenticated
	}
	var nonceKey [16]byte
	if n, err := hex.Decode(nonceKey[:], []byte(nonce)); err != nil || n != len(nonceKey) {
		return "", nil, errUnauthenticated
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || strconv.FormatInt(secs, 10) != ts {
		return "", nil, errUnauthenticated
	}
	now := g.a.now()
	if d := now.Sub(time.Unix(secs, 0)); d > authSkew || d < -authSkew {
		return "", nil, errUnauthenticated
	}
	got, err := hex.DecodeString(f[5])
	if err != nil || len(got) != sha256.Size {
		return "", nil, errUnauthenticated
	}
	names, ok := parseHeaderList(r.Header.Values(HeadersHeader))
	if !ok {
		return "", nil, errUnauthenticated
	}
	m := g.a.newMAC("request")
	m.fields(authVersion, string(purpose), g.node, ts, nonce, flag, r.Method, r.Host, r.RequestURI)
	m.headers(names, r.Header)
	mac := m.sum()
	if !hmac.Equal(got, mac) {
		return "", nil, errUnauthenticated
	}
	// The framing must be what was signed: no body, or a chunked one
	// (its proof in the trailer).
	chunked := len(r.TransferEncoding) == 1 && r.TransferEncoding[0] == "chunked"
	if flag == "0" && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) || flag == "1" && !chunked {
		return "", nil, errUnauthenticated
	}
	announced := int64(-1)
	if v := r.Header.Get(LengthHeader); v != "" {
		if announced, err = strconv.ParseInt(v, 10, 64); err != nil || announced < 0 || flag == "0" {
			return "", nil, errUnauthenticated
		}
	}
	if !g.nonces.add(secs, nonceKey, now) {
		return "", nil, errUnauthenticated // a replay (or a full cache: fail closed)
	}
	keepOnly(r.Header, names, "Content-Length")
	delete(r.Header, AuthHeader)
	delete(r.Header, HeadersHeader)
	delete(r.Header, LengthHeader)
	if flag == "1" {
		r.Body = &verifyingBody{rc: r.Body, h: sha256.New(), a: g.a, label: "request body", mac: mac, announced: announced,
			trailer: func() http.Header { return r.Trailer }}
		if announced >= 0 {
			r.ContentLength, r.TransferEncoding = announced, nil
			r.Header.Set("Content-Length", strconv.FormatInt(announced, 10))
		}
	}
	return purpose, mac, nil
}

// Serve serves h only the requests that pass Check, with their purpose
// in their context (PurposeOf) and with no trailers (the body's proof is
// checked at its end), and signs h's answers. The others get 401 with
// nothing of h's.
func (g *Guard) Serve(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		purpose, mac, err := g.Check(r)
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"code":401,"message":"` + err.Error() + `"}`))
			return
		}
		// r keeps its trailer (the body's proof arrives there); h's
		// copy has none.
		in := r.WithContext(WithPurpose(r.Context(), purpose))
		in.Trailer = nil
		aw := &answerWriter{w: w, a: g.a, reqMAC: mac, head: r.Method == http.MethodHead}
		h.ServeHTTP(aw, in)
		aw.finish()
	})
}

// ErrBodyTooLarge is BufferBody's error for a body over its bound.
var ErrBodyTooLarge = errors.New("cluster: the request's body is too large")

// BufferBody reads r's body whole (at most max bytes) and so verifies it
// before anything acts on it; r's body is then the verified bytes.
func BufferBody(r *http.Request, max int64) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return err
	}
	if int64(len(b)) > max {
		return ErrBodyTooLarge
	}
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.ContentLength = int64(len(b))
	r.TransferEncoding = nil
	return nil
}

// Prefetch reads up to n bytes of r's body: a body that ends within them
// is verified before anything acts on it (BufferBody); a longer one is
// verified at its end, where a mismatch is its reader's error.
func Prefetch(r *http.Request, n int64) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, n+1))
	if err != nil {
		return err
	}
	if int64(len(b)) <= n {
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
		r.TransferEncoding = nil
		return nil
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), r.Body), r.Body}
	return nil
}

// answerWriter signs a node's answer, bound to its request's MAC. An
// answer of at most maxBufferedAnswer bytes is sent whole, its body in
// the MAC ("b"); a longer or flushed one streams, its proof in the
// BodyTrailer ("t"); one with no body (HEAD, 204, 304) and a protocol
// switch (101) are signed head only ("h"): what follows a switch is not
// authenticated.
type answerWriter struct {
	w      http.ResponseWriter
	a      *Auth
	reqMAC []byte
	head   bool // a HEAD request's answer

	status    int
	mode      string // "" until the head is sent
	buf       []byte
	h         hash.Hash
	n         int64
	mac       []byte
	hijacked  bool
	streaming bool
}

func (aw *answerWriter) Header() http.Header { return aw.w.Header() }

// Unwrap lets http.ResponseController reach the connection's controls.
func (aw *answerWriter) Unwrap() http.ResponseWriter { return aw.w }

func (aw *answerWriter) WriteHeader(code int) {
	if aw.status != 0 || aw.hijacked {
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		aw.w.WriteHeader(code) // informational: no proof needed
		return
	}
	aw.status = code
	if code == http.StatusSwitchingProtocols || aw.head || code == http.StatusNoContent || code == http.StatusNotModified {
		aw.sendHead("h", nil)
	}
}

// sign sets the answer's MAC and signed headers list in h.
func (aw *answerWriter) sign(h http.Header, status int, mode string, body []byte) {
	names := normalizeHeaders(h)
	// "Connection: close" is for this hop (the node's server closes after
	// the answer) and a client drops it from the answers it reads: it
	// cannot be signed. Other Connection values (a switch's Upgrade) are.
	if httpguts.HeaderValuesContainsToken(h["Connection"], "close") {
		names = slices.DeleteFunc(names, func(n string) bool { return n == "Connection" })
	}
	h.Set(HeadersHeader, strings.Join(names, ","))
	m := aw.a.newMAC("answer")
	m.fields(authVersion, string(aw.reqMAC), mode, strconv.Itoa(status))
	m.headers(names, h)
	if mode == "b" {
		sum := sha256.Sum256(body)
		m.fields(string(sum[:]), strconv.Itoa(len(body)))
	}
	aw.mac = m.sum()
	h.Set(AuthHeader, authVersion+"."+mode+"."+hex.EncodeToString(aw.mac))
}

// sendHead signs and sends the head in mode.
func (aw *answerWriter) sendHead(mode string, body []byte) {
	aw.mode = mode
	h := aw.w.Header()
	stripInternal(h)
	switch mode {
	case "b":
		h.Set("Content-Length", strconv.Itoa(len(body)))
	case "t":
		if cl := h.Get("Content-Length"); cl != "" {
			h.Set(LengthHeader, cl)
			h.Del("Content-Length")
		}
		aw.h = sha256.New()
	}
	aw.sign(h, aw.status, mode, body)
	if mode == "t" {
		h.Add("Trailer", BodyTrailer)
	}
	aw.w.WriteHeader(aw.status)
}

func (aw *answerWriter) Write(p []byte) (int, error) {
	if aw.hijacked {
		return 0, http.ErrHijacked
	}
	if aw.status == 0 {
		aw.WriteHeader(http.StatusOK)
	}
	switch aw.mode {
	case "h":
		return aw.w.Write(p)
	case "t":
		return aw.stream(p)
	}
	if len(aw.buf)+len(p) <= maxBufferedAnswer {
		aw.buf = append(aw.buf, p...)
		return len(p), nil
	}
	if err := aw.startStream(); err != nil {
		return 0, err
	}
	return aw.stream(p)
}

func (aw *answerWriter) startStream() error {
	aw.sendHead("t", nil)
	buf := aw.buf
	aw.buf = nil
	_, err := aw.stream(buf)
	return err
}

func (aw *answerWriter) stream(p []byte) (int, error) {
	n, err := aw.w.Write(p)
	aw.h.Write(p[:n])
	aw.n += int64(n)
	return n, err
}

// Flush sends what is buffered: the answer streams from then on.
func (aw *answerWriter) Flush() { _ = aw.FlushError() }

func (aw *answerWriter) FlushError() error {
	if aw.hijacked {
		return http.ErrHijacked
	}
	if aw.status == 0 {
		aw.WriteHeader(http.StatusOK)
	}
	if aw.mode == "" {
		if err := aw.startStream(); err != nil {
			return err
		}
	}
	return http.NewResponseController(aw.w).Flush()
}

// finish sends a buffered answer, or a streamed one's proof.
func (aw *answerWriter) finish() {
	if aw.hijacked {
		return
	}
	if aw.status == 0 {
		aw.WriteHeader(http.StatusOK)
	}
	switch aw.mode {
	case "":
		aw.sendHead("b", aw.buf)
		_, _ = aw.w.Write(aw.buf)
	case "t":
		aw.w.Header().Set(BodyTrailer, aw.a.bodyProof("answer body", aw.mac, aw.h.Sum(nil), aw.n))
	}
}

// Hijack hands the connection over for a protocol switch: the 101 head
// the handler writes is signed on its way out; nothing after it is.
func (aw *answerWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if aw.status != 0 {
		return nil, nil, errors.New("cluster: hijack after the answer's head")
	}
	conn, brw, err := http.NewResponseController(aw.w).Hijack()
	if err != nil {
		return nil, nil, err
	}
	aw.hijacked = true
	hs := &headSigner{aw: aw, out: brw.Writer}
	return conn, bufio.NewReadWriter(brw.Reader, bufio.NewWriter(hs)), nil
}

// maxHead bounds a hijacker's answer head.
const maxHead = 64 << 10

// headSigner takes a hijacker's 101 head, signs it and sends it on;
// what follows it passes as it is.
type headSigner struct {
	aw   *answerWriter
	out  *bufio.Writer
	buf  []byte
	done bool
}

func (s *headSigner) Write(p []byte) (int, error) {
	if s.done {
		n, err := s.out.Write(p)
		if err == nil {
			err = s.out.Flush()
		}
		return n, err
	}
	s.buf = append(s.buf, p...)
	end := bytes.Index(s.buf, []byte("\r\n\r\n"))
	if end < 0 {
		if len(s.buf) > maxHead {
			return 0, errors.New("cluster: a hijacker's head is too long")
		}
		return len(p), nil
	}
	head, rest := s.buf[:end+4], s.buf[end+4:]
	res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(head)), nil)
	if err != nil {
		return 0, fmt.Errorf("cluster: a hijacker's head: %w", err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		return 0, fmt.Errorf("cluster: a hijacker answered %d: only a protocol switch is signed", res.StatusCode)
	}
	stripInternal(res.Header)
	s.aw.sign(res.Header, res.StatusCode, "h", nil)
	fmt.Fprintf(s.out, "HTTP/1.1 %s\r\n", res.Status)
	if err := res.Header.Write(s.out); err != nil {
		return 0, err
	}
	s.out.WriteString("\r\n")
	s.out.Write(rest)
	s.done, s.buf = true, nil
	if err := s.out.Flush(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// stripInternal drops the authentication's headers a handler passed on
// (a sandbox's answer may hold anything).
func stripInternal(h http.Header) {
	for k := range h {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "Warren-Cluster-") {
			delete(h, k)
		}
	}
}

// maxNonces bounds the nonces a node remembers: beyond them (a million
// signed requests within the skew window) requests are refused rather
// than a replay risked.
const maxNonces = 1 << 20

// nonceBucket is the span of request times whose nonces are kept
// together and forgotten together.
const nonceBucket = 10 // seconds

// nonceCache remembers the nonces of the requests taken, by their
// signed time, until that time is outside the skew window. A replay
// carries the same signed time, so it is looked up in one bucket.
type nonceCache struct {
	mu      sync.Mutex
	buckets map[int64]map[[16]byte]struct{}
	n       int
}

// add remembers nonce of a request signed at ts; false if it was seen
// (or the cache is full).
func (c *nonceCache) add(ts int64, nonce [16]byte, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buckets == nil {
		c.buckets = map[int64]map[[16]byte]struct{}{}
	}
	oldest := now.Add(-authSkew).Unix()
	for b, m := range c.buckets {
		if (b+1)*nonceBucket <= oldest { // every time in it is too old now
			c.n -= len(m)
			delete(c.buckets, b)
		}
	}
	b := ts / nonceBucket
	if ts < 0 {
		b = (ts - nonceBucket + 1) / nonceBucket
	}
	m := c.buckets[b]
	if _, seen := m[nonce]; seen || c.n >= maxNonces {
		return false
	}
	if m == nil {
		m = map[[16]byte]struct{}{}
		c.buckets[b] = m
	}
	m[nonce] = struct{}{}
	c.n++
	return true
}
