package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"net/http"
	"net/textproto"
	"os"
	"sort"
	"strings"
	"time"
)

// The processes of a cluster authenticate each other with a MAC under a
// key derived from the cluster secret (docs/cluster-security.md). A
// request from an api (or a node pulling an image) to a node's internal
// address carries
//
//	Warren-Cluster-Auth: 2.<purpose>.<unix seconds>.<nonce>.<bodyflag>.<mac>
//	Warren-Cluster-Headers: <the signed headers' names>
//
// where the MAC covers the purpose, the name of the node it is meant
// for, the time, the nonce, the method, the Host, the request target
// (escaped path and raw query), the signed headers' values and whether a
// body follows (bodyflag 1). A body travels chunked, its SHA-256 and
// length in the trailer BodyTrailer, MACed under the request's MAC; the
// node verifies it at the body's end. The node remembers nonces for the
// skew window, so a captured request is good once, on one node, for one
// purpose. The node's answer is signed the same way, bound to the
// request's MAC (serve.go, transport.go).

// AuthHeader carries a request's (and its answer's) MAC.
const AuthHeader = "Warren-Cluster-Auth"

// HeadersHeader lists the headers a request's (or answer's) MAC covers;
// a node drops every other header but the message's framing.
const HeadersHeader = "Warren-Cluster-Headers"

// BodyTrailer is the trailer of a signed body: "<sha256 hex>.<length>.<mac>".
const BodyTrailer = "Warren-Cluster-Body"

// LengthHeader carries a body's Content-Length while the body travels
// chunked (for its trailer): the receiver restores it.
const LengthHeader = "Warren-Cluster-Content-Length"

// authVersion is the header format's version, its first field.
const authVersion = "2"

// authSkew is how far a request's time may be from the node's clock: a
// captured header is good for no longer than this, and its nonce is
// remembered that long.
const authSkew = 60 * time.Second

// MinSecretLen is the shortest cluster secret taken (e.g. `openssl rand
// -hex 32` gives 64 characters).
const MinSecretLen = 32

// Purpose is what a request to a node is for. The node dispatches on it,
// never on the path: sandbox traffic whose path looks like an RPC is
// still sandbox traffic.
type Purpose string

const (
	// PurposeRPC is a NodeService call (internal/noderpc).
	PurposeRPC Purpose = "rpc"
	// PurposeImages is a node pulling an image from another
	// (internal/imagepeer).
	PurposeImages Purpose = "images"
	// PurposePlatform is a platform API request an api forwards to a
	// node (the template routes).
	PurposePlatform Purpose = "platform"
	// PurposeTraffic is sandbox traffic an api's proxy forwards.
	PurposeTraffic Purpose = "traffic"
)

// Valid says whether p is one of the purposes.
func (p Purpose) Valid() bool {
	switch p {
	case PurposeRPC, PurposeImages, PurposePlatform, PurposeTraffic:
		return true
	}
	return false
}

type purposeKey struct{}
type targetKey struct{}

// WithPurpose returns ctx whose requests through Auth.Transport are
// signed for purpose p. On a node, the context of a request that passed
// Guard carries its verified purpose.
func WithPurpose(ctx context.Context, p Purpose) context.Context {
	return context.WithValue(ctx, purposeKey{}, p)
}

// PurposeOf is the purpose in ctx (WithPurpose), "" if none.
func PurposeOf(ctx context.Context) Purpose {
	p, _ := ctx.Value(purposeKey{}).(Purpose)
	return p
}

// WithTarget returns ctx whose requests through Auth.Transport are meant
// for the node named node: another node refuses them.
func WithTarget(ctx context.Context, node string) context.Context {
	return context.WithValue(ctx, targetKey{}, node)
}

// TargetOf is the node name in ctx (WithTarget), "" if none.
func TargetOf(ctx context.Context) string {
	t, _ := ctx.Value(targetKey{}).(string)
	return t
}

// Auth signs and checks the messages between the processes of a cluster
// with the cluster secret. The internal address carries no TLS: it
// belongs on a network only the cluster's hosts reach
// (docs/cluster-security.md).
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
	// The key authenticates messages only; the secret also seals team
	// secrets (secret.SealerFromClusterSecret), under another derivation.
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("warren cluster message authentication v2"))
	return &Auth{key: m.Sum(nil), now: time.Now}, nil
}

// SkewClock moves this process's cluster clock (the time it signs
// requests with and checks others' against) by d: a test-only clock skew
// (WARREN_TEST_CLOCK_OFFSET, docs/chaos.md), the host's clock untouched.
func (a *Auth) SkewClock(d time.Duration) {
	a.now = func() time.Time { return time.Now().Add(d) }
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

// macWriter feeds fields to an HMAC, each with its length first, so that
// no two lists of fields read the same.
type macWriter struct{ h hash.Hash }

func (a *Auth) newMAC(label string) macWriter {
	m := macWriter{hmac.New(sha256.New, a.key)}
	m.field(label)
	return m
}

func (m macWriter) field(s string) {
	var n [binary.MaxVarintLen64]byte
	m.h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	m.h.Write([]byte(s))
}

func (m macWriter) fields(ss ...string) {
	for _, s := range ss {
		m.field(s)
	}
}

// headers feeds the listed headers' values (names canonical).
func (m macWriter) headers(names []string, h http.Header) {
	m.field(fmt.Sprint(len(names)))
	for _, n := range names {
		vs := h[n]
		m.field(n)
		m.field(fmt.Sprint(len(vs)))
		m.fields(vs...)
	}
}

func (m macWriter) sum() []byte { return m.h.Sum(nil) }

// unsigned are the headers no MAC covers: the message's framing, which
// the HTTP stack sets, and the authentication's own.
var unsigned = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true,
	AuthHeader: true, HeadersHeader: true,
}

// maxSignedHeaders bounds the names HeadersHeader may list.
const maxSignedHeaders = 256

// normalizeHeaders makes h what the receiver parses from the wire (names
// canonical, values with no line breaks or surrounding white space, a
// User-Agent given once and not empty), so that both sides MAC the same,
// and returns the names to sign, sorted.
func normalizeHeaders(h http.Header) []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ck := http.CanonicalHeaderKey(k)
		vs := h[k]
		if ck != k {
			delete(h, k)
			h[ck] = append(h[ck], vs...)
		}
	}
	for _, vs := range h {
		for i, v := range vs {
			vs[i] = textproto.TrimString(strings.NewReplacer("\r", " ", "\n", " ").Replace(v))
		}
	}
	if ua, ok := h["User-Agent"]; ok {
		if len(ua) == 0 || ua[0] == "" {
			delete(h, "User-Agent")
		} else {
			h["User-Agent"] = ua[:1]
		}
	}
	names := make([]string, 0, len(h))
	for k := range h {
		// A handler's trailers set ahead (http.TrailerPrefix) are not in
		// the head.
		if !unsigned[k] && !strings.HasPrefix(k, http.TrailerPrefix) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return names
}

// parseHeaderList parses a HeadersHeader: canonical names, each once, none
// of the unsigned ones.
func parseHeaderList(vs []string) ([]string, bool) {
	if len(vs) > 1 {
		return nil, false
	}
	if len(vs) == 0 || vs[0] == "" {
		return nil, true
	}
	names := strings.Split(vs[0], ",")
	if len(names) > maxSignedHeaders {
		return nil, false
	}
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if n == "" || http.CanonicalHeaderKey(n) != n || unsigned[n] || seen[n] || strings.ContainsAny(n, " \t") {
			return nil, false
		}
		seen[n] = true
	}
	return names, true
}

// keepOnly removes from h every header that is not listed, but the
// framing the HTTP stack reads (keep).
func keepOnly(h http.Header, listed []string, keep ...string) {
	ok := make(map[string]bool, len(listed)+len(keep))
	for _, n := range listed {
		ok[n] = true
	}
	for _, n := range keep {
		ok[n] = true
	}
	for k := range h {
		if !ok[k] {
			delete(h, k)
		}
	}
}

// bodyProof is a BodyTrailer's value for a body of digest and length
// under the MAC mac of its message.
func (a *Auth) bodyProof(label string, mac []byte, digest []byte, n int64) string {
	m := a.newMAC(label)
	m.fields(string(mac), string(digest), fmt.Sprint(n))
	return fmt.Sprintf("%x.%d.%x", digest, n, m.sum())
}
