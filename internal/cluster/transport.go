package cluster

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Transport signs every request it sends through base (nil:
// http.DefaultTransport) for the purpose and target node in its context
// (WithPurpose, WithTarget; a request without them is refused here), and
// takes only answers the node signed for that request: their status and
// headers at once, their body at its end (a body that does not match its
// proof ends in an error, never in io.EOF).
func (a *Auth) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return signingTransport{a: a, base: base}
}

type signingTransport struct {
	a    *Auth
	base http.RoundTripper
}

// ErrAnswerUnauthenticated is what a caller gets for an answer that the
// node did not sign for its request, or whose body does not match the
// node's proof.
var ErrAnswerUnauthenticated = errors.New("cluster: the node's answer is not authenticated")

func (t signingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	purpose, target := PurposeOf(r.Context()), TargetOf(r.Context())
	if !purpose.Valid() || target == "" {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("cluster: a request to a node needs its purpose and target node (cluster.WithPurpose, cluster.WithTarget): got %q, %q", purpose, target)
	}
	out := r.Clone(r.Context()) // a RoundTripper must not change its request
	mac, err := t.a.sign(out, purpose, target)
	if err != nil {
		return nil, err
	}
	res, err := t.base.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	if err := t.a.checkAnswer(out, mac, res); err != nil {
		res.Body.Close()
		return nil, err
	}
	return res, nil
}

// Sign signs r for purpose on the node named target, as Transport does
// (tests; a caller sends r through Transport instead).
func (a *Auth) Sign(r *http.Request, purpose Purpose, target string) error {
	_, err := a.sign(r, purpose, target)
	return err
}

// sign makes r a signed request and returns its MAC. A body is sent
// chunked, its proof in the BodyTrailer once it is read.
func (a *Auth) sign(r *http.Request, purpose Purpose, target string) ([]byte, error) {
	if !purpose.Valid() || target == "" {
		return nil, fmt.Errorf("cluster: sign: purpose %q, target %q", purpose, target)
	}
	if r.Host == "" {
		r.Host = r.URL.Host
	}
	stripInternal(r.Header) // the caller's (a proxied client's) are never passed on
	flag := "0"
	var body *signingBody
	if r.Body != nil && r.Body != http.NoBody {
		flag = "1"
		if r.ContentLength > 0 {
			r.Header.Set(LengthHeader, strconv.FormatInt(r.ContentLength, 10))
		}
		body = &signingBody{rc: r.Body, h: sha256.New(), a: a, trailer: http.Header{BodyTrailer: nil}}
		r.Body, r.GetBody, r.ContentLength = body, nil, -1
		r.Trailer = body.trailer
	}
	names := normalizeHeaders(r.Header)
	for _, n := range names {
		// What the HTTP client refuses to send is refused here first.
		if !httpguts.ValidHeaderFieldName(n) {
			return nil, fmt.Errorf("cluster: invalid header name %q", n)
		}
		for _, v := range r.Header[n] {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, fmt.Errorf("cluster: invalid value of header %s", n)
			}
		}
	}
	if len(names) > maxSignedHeaders {
		return nil, fmt.Errorf("cluster: a request with %d headers (at most %d are signed)", len(names), maxSignedHeaders)
	}
	r.Header.Set(HeadersHeader, strings.Join(names, ","))
	ts := strconv.FormatInt(a.now().Unix(), 10)
	var nb [16]byte
	_, _ = rand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	m := a.newMAC("request")
	m.fields(authVersion, string(purpose), target, ts, nonce, flag, r.Method, r.Host, r.URL.RequestURI())
	m.headers(names, r.Header)
	mac := m.sum()
	r.Header.Set(AuthHeader, strings.Join([]string{authVersion, string(purpose), ts, nonce, flag, hex.EncodeToString(mac)}, "."))
	if body != nil {
		body.mac = mac
	}
	return mac, nil
}

// signingBody hashes a request's body and, at its end, sets the proof in
// the request's trailer (which the HTTP client sends after the body).
type signingBody struct {
	rc      io.ReadCloser
	h       hash.Hash
	n       int64
	a       *Auth
	mac     []byte
	trailer http.Header
}

func (b *signingBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	if errors.Is(err, io.EOF) {
		b.trailer.Set(BodyTrailer, b.a.bodyProof("request body", b.mac, b.h.Sum(nil), b.n))
	}
	return n, err
}

func (b *signingBody) Close() error { return b.rc.Close() }

// maxBufferedAnswer is the longest answer a node sends whole, its body in
// its MAC (so that it keeps its Content-Length); a longer one streams,
// its proof in a trailer.
const maxBufferedAnswer = 4 << 10

// checkAnswer verifies res, the answer to req whose MAC is reqMAC: its
// status and signed headers now (unsigned ones are dropped), its body
// (buffered answers) now or (streamed ones) at its end.
func (a *Auth) checkAnswer(req *http.Request, reqMAC []byte, res *http.Response) error {
	vs := res.Header.Values(AuthHeader)
	if len(vs) != 1 {
		if res.StatusCode == http.StatusUnauthorized {
			return fmt.Errorf("%w: the node refused the request's cluster authentication (401): is the cluster secret the same on both?", ErrAnswerUnauthenticated)
		}
		return fmt.Errorf("%w: it does not prove the node holds the cluster secret", ErrAnswerUnauthenticated)
	}
	f := strings.Split(vs[0], ".")
	if len(f) != 3 || f[0] != authVersion {
		return ErrAnswerUnauthenticated
	}
	mode := f[1]
	got, err := hex.DecodeString(f[2])
	if err != nil || len(got) != sha256.Size {
		return ErrAnswerUnauthenticated
	}
	names, ok := parseHeaderList(res.Header.Values(HeadersHeader))
	if !ok {
		return ErrAnswerUnauthenticated
	}
	m := a.newMAC("answer")
	m.fields(authVersion, string(reqMAC), mode, strconv.Itoa(res.StatusCode))
	m.headers(names, res.Header)
	switch mode {
	case "b": // the body is in the MAC
		if res.ContentLength < 0 || res.ContentLength > maxBufferedAnswer {
			return ErrAnswerUnauthenticated
		}
		b, err := io.ReadAll(io.LimitReader(res.Body, maxBufferedAnswer+1))
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		m.fields(string(sum[:]), strconv.Itoa(len(b)))
		if !hmac.Equal(got, m.sum()) {
			return fmt.Errorf("%w: its status, headers or body are not the node's", ErrAnswerUnauthenticated)
		}
		res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(b))
	case "t": // the body's proof is in its trailer
		if !hmac.Equal(got, m.sum()) {
			return fmt.Errorf("%w: its status or headers are not the node's", ErrAnswerUnauthenticated)
		}
		announced := int64(-1)
		if v := res.Header.Get(LengthHeader); v != "" {
			if announced, err = strconv.ParseInt(v, 10, 64); err != nil || announced < 0 {
				return ErrAnswerUnauthenticated
			}
			res.ContentLength = announced
			res.Header.Set("Content-Length", v)
		}
		if res.Trailer != nil {
			delete(res.Trailer, BodyTrailer) // declared; set again at the end
		}
		res.Body = &verifyingBody{rc: res.Body, h: sha256.New(), a: a, label: "answer body", mac: got, announced: announced,
			trailer: func() http.Header { return res.Trailer }}
	case "h": // a head only: no body, or a protocol switch
		if !hmac.Equal(got, m.sum()) {
			return fmt.Errorf("%w: its status or headers are not the node's", ErrAnswerUnauthenticated)
		}
		if res.StatusCode != http.StatusSwitchingProtocols && req.Method != http.MethodHead &&
			res.StatusCode != http.StatusNoContent && res.StatusCode != http.StatusNotModified {
			return ErrAnswerUnauthenticated
		}
	default:
		return ErrAnswerUnauthenticated
	}
	delete(res.Header, LengthHeader)
	keepOnly(res.Header, names, "Content-Length")
	delete(res.Header, AuthHeader)
	delete(res.Header, HeadersHeader)
	return nil
}

// errBodyUnauthenticated ends a body that does not match its proof.
var errBodyUnauthenticated = errors.New("cluster: the body does not match its sender's proof (changed on the way, or cut short)")

// verifyingBody hashes a body and, at its end, checks the proof in its
// trailer: a mismatch is an error in place of io.EOF.
type verifyingBody struct {
	rc        io.ReadCloser
	h         hash.Hash
	n         int64
	a         *Auth
	label     string
	mac       []byte
	announced int64 // -1: unknown
	trailer   func() http.Header
	err       error
}

func (b *verifyingBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.rc.Read(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	if b.announced >= 0 && b.n > b.announced {
		b.err = errBodyUnauthenticated
		return 0, b.err
	}
	if errors.Is(err, io.EOF) {
		tr := b.trailer()
		want := b.a.bodyProof(b.label, b.mac, b.h.Sum(nil), b.n)
		if tr == nil || len(tr[BodyTrailer]) != 1 || !hmac.Equal([]byte(tr[BodyTrailer][0]), []byte(want)) ||
			b.announced >= 0 && b.n != b.announced {
			b.err = errBodyUnauthenticated
			return n, b.err
		}
		delete(tr, BodyTrailer) // the proof goes no further
		b.err = io.EOF
	} else if err != nil {
		b.err = err
	}
	return n, err
}

func (b *verifyingBody) Close() error { return b.rc.Close() }

// Bind returns rt (an Auth.Transport) whose requests are all for purpose
// on the node named target (a client of one node for one purpose).
func Bind(rt http.RoundTripper, purpose Purpose, target string) http.RoundTripper {
	return boundTransport{rt: rt, purpose: purpose, target: target}
}

type boundTransport struct {
	rt      http.RoundTripper
	purpose Purpose
	target  string
}

func (t boundTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := WithTarget(WithPurpose(r.Context(), t.purpose), t.target)
	return t.rt.RoundTrip(r.WithContext(ctx))
}
