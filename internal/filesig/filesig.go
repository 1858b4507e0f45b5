// Package filesig is the scheme of envd's signed /files URLs, which the
// E2B SDK's uploadUrl() and downloadUrl() make: the signature, the query
// that carries it, and its check. envd checks a URL against its own
// token; the sandbox proxy uses the same check to find the sandbox a
// signed URL without a sandbox ID belongs to.
package filesig

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// The operations a signature is for.
const (
	Read  = "read"
	Write = "write"
)

// Operation is the operation of a /files request by its method: "read"
// for GET, "write" for POST, "" for any other.
func Operation(method string) string {
	switch method {
	case http.MethodGet:
		return Read
	case http.MethodPost:
		return Write
	}
	return ""
}

// Signature computes the signature of a pre-signed /files URL, as the E2B
// SDK does: "v1_" + unpadded base64 of SHA-256 over
// "<path>:<operation>:<user>:<token>[:<expiration>]", where path is exactly
// as given in the URL, operation is "read" or "write", user may be empty
// and expiration is in unix seconds.
func Signature(path, operation, user, token string, expiration *int64) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != nil {
		raw += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// Query is what the query of a /files URL says: the file, the user it is
// read or written as, and an optional signature that stands in for the
// access token.
type Query struct {
	Path       string // as given; envd resolves it against the user's home
	Username   string // "" for the sandbox's default user
	Signature  string
	Expiration string // signature_expiration, unix seconds; "" for none
}

// ParseQuery reads the raw query of a /files URL. A query that does not
// parse is an error (net/url would silently drop the bad pairs, and a path
// could vanish from under its signature); of a repeated parameter the
// first value counts, the one the signature is checked against.
func ParseQuery(raw string) (Query, error) {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return Query{}, errors.New("invalid query string: " + err.Error())
	}
	return Query{
		Path:       v.Get("path"),
		Username:   v.Get("username"),
		Signature:  v.Get("signature"),
		Expiration: v.Get("signature_expiration"),
	}, nil
}

// Signed reports whether q's signature was made for operation with token,
// whatever its expiration: the comparison takes the same time whether it
// holds or not. An empty token or signature never holds.
func (q Query) Signed(operation, token string) bool {
	if token == "" || q.Signature == "" {
		return false
	}
	var exp *int64
	if q.Expiration != "" {
		v, err := strconv.ParseInt(q.Expiration, 10, 64)
		if err != nil {
			return false
		}
		exp = &v
	}
	want := Signature(q.Path, operation, q.Username, token, exp)
	return subtle.ConstantTimeCompare([]byte(want), []byte(q.Signature)) == 1
}

// Verify checks q's signature for operation under token (never empty) at
// time now, with E2B's envd's messages. As there, the signature is checked
// before the expiration, so only a genuine URL learns that it has expired.
func (q Query) Verify(operation, token string, now time.Time) error {
	if q.Signature == "" {
		return errors.New("missing signature query parameter")
	}
	if q.Expiration != "" {
		if _, err := strconv.ParseInt(q.Expiration, 10, 64); err != nil {
			return errors.New("invalid signature_expiration")
		}
	}
	if !q.Signed(operation, token) {
		return errors.New("invalid signature")
	}
	if q.Expiration != "" {
		if exp, _ := strconv.ParseInt(q.Expiration, 10, 64); exp < now.Unix() {
			return errors.New("signature is already expired")
		}
	}
	return nil
}
