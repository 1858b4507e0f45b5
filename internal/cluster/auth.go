package cluster

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// AuthHeader carries a request's proof that its sender holds the cluster
// secret: "<unix seconds>.<nonce>.<hex HMAC-SHA256>" over the time, the
// nonce, the method and the path. Every request to a node's internal
// address has one, and the node's answer carries in the same header the
// HMAC of the request's: the api knows it reached a holder of the secret,
// and an answer cannot be replayed to another request.
const AuthHeader = "Warren-Cluster-Auth"

// authSkew is how far a request's time may be from the node's clock: a
// captured header is good for no longer than this.
const authSkew = 60 * time.Second

// MinSecretLen is the shortest cluster secret taken (e.g. `openssl rand
// -hex 32` gives 64 characters).
const MinSecretLen = 32

// Auth signs and checks requests between the processes of a cluster with
// the cluster secret. It authenticates the api to the nodes; the internal
// address carries no TLS, so it belongs on a network only the cluster's
// hosts reach (see README's Cluster section).
type Auth struct {
	key []byte
	now func() time.Time
}

// NewAuth returns an Auth for secret, which must be at least MinSecretLen
// bytes.
func NewAuth(secret []byte) (*Auth, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("the cluster secret is %d bytes: it must be at least %d (e.g. `openssl rand -hex 32`)", len(secret), MinSecretLen)
	}
	// The key authenticates requests only; the secret also seals team
	// secrets (secret.SealerFromClusterSecret), under another derivation.
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("warren cluster request authentication v1"))
	return &Auth{key: m.Sum(nil), now: time.Now}, nil
}

// LoadSecret reads the cluster secret from file (surrounding white space
// dropped), else from the environment variable WARREN_CLUSTER_SECRET; nil
// when neither is set.
func LoadSecret(file string) ([]byte, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--cluster-secret-file: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return nil, fmt.Errorf("--cluster-secret-file %s is empty", file)
		}
		return []byte(s), nil
	}
	if s := strings.TrimSpace(os.Getenv("WARREN_CLUSTER_SECRET")); s != "" {
		return []byte(s), nil
	}
	return nil, nil
}

func (a *Auth) mac(parts ...string) string {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(strings.Join(parts, "\n")))
	return hex.EncodeToString(m.Sum(nil))
}

// Sign sets r's AuthHeader.
func (a *Auth) Sign(r *http.Request) {
	ts := strconv.FormatInt(a.now().Unix(), 10)
	var b [12]byte
	_, _ = rand.Read(b[:])
	nonce := hex.EncodeToString(b[:])
	r.Header.Set(AuthHeader, ts+"."+nonce+"."+a.mac("request", ts, nonce, r.Method, r.URL.Path))
}

// answer is the AuthHeader of the answer to a request whose AuthHeader
// is req.
func (a *Auth) answer(req string) string { return a.mac("answer", req) }

// errUnauthenticated is what a request without a valid AuthHeader gets;
// it does not say which part failed.
var errUnauthenticated = errors.New("cluster authentication failed")

// Check verifies r's AuthHeader: given once, made with the secret for r's
// method and path, within authSkew of now.
func (a *Auth) Check(r *http.Request) error {
	vs := r.Header.Values(AuthHeader)
	if len(vs) != 1 {
		return errUnauthenticated
	}
	f := strings.Split(vs[0], ".")
	if len(f) != 3 {
		return errUnauthenticated
	}
	secs, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return errUnauthenticated
	}
	if d := a.now().Sub(time.Unix(secs, 0)); d > authSkew || d < -authSkew {
		return errUnauthenticated
	}
	if !hmac.Equal([]byte(f[2]), []byte(a.mac("request", f[0], f[1], r.Method, r.URL.Path))) {
		return errUnauthenticated
	}
	return nil
}

// CheckAnswer verifies that res answers req (signed by Sign) from a
// holder of the secret.
func (a *Auth) CheckAnswer(req *http.Request, res *http.Response) error {
	want := a.answer(req.Header.Get(AuthHeader))
	if got := res.Header.Values(AuthHeader); len(got) != 1 || !hmac.Equal([]byte(got[0]), []byte(want)) {
		return errors.New("the node's answer does not prove it holds the cluster secret")
	}
	return nil
}

// Require serves h only to requests that pass Check; the others get 401
// with nothing of h's.
func (a *Auth) Require(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := a.Check(r); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"code":401,"message":"` + err.Error() + `"}`))
			return
		}
		w.Header().Set(AuthHeader, a.answer(r.Header.Get(AuthHeader)))
		r.Header.Del(AuthHeader)
		h.ServeHTTP(w, r)
	})
}

// Transport signs every request it sends through base (nil:
// http.DefaultTransport) and checks every answer.
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

// RoundTrip signs r and takes only an answer that proves the node holds
// the secret (a 401 of the node's own, for a request it refused, too).
func (t signingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context()) // a RoundTripper must not change its request
	t.a.Sign(r)
	res, err := t.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if err := t.a.CheckAnswer(r, res); err != nil && res.StatusCode != http.StatusUnauthorized {
		res.Body.Close()
		return nil, err
	}
	res.Header.Del(AuthHeader) // the proof goes no further (the proxy's client)
	return res, nil
}
