package files

import (
	"crypto/subtle"
	"errors"
	"net/url"
	"strconv"
	"time"
)

// fileQuery is what the query of a /files URL says: the file, the user it
// is read or written as, and an optional signature that stands in for the
// access token.
type fileQuery struct {
	Path       string // as given; users.User.ResolvePath makes it absolute
	Username   string // "" for the sandbox's default user
	Signature  string
	Expiration string // signature_expiration, unix seconds; "" for none
}

// parseFileQuery reads the raw query of a /files URL. A query that does
// not parse is an error (net/url would silently drop the bad pairs, and a
// path could vanish from under its signature); of a repeated parameter the
// first value counts, the one the signature was checked against.
func parseFileQuery(raw string) (fileQuery, error) {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return fileQuery{}, errors.New("invalid query string: " + err.Error())
	}
	return fileQuery{
		Path:       v.Get("path"),
		Username:   v.Get("username"),
		Signature:  v.Get("signature"),
		Expiration: v.Get("signature_expiration"),
	}, nil
}

// verify checks the query's signature for operation ("read" or "write")
// under token (never empty: see Handler.authenticate) at time now. As in
// E2B's envd, the signature is checked before the expiration, so that only
// a genuine URL learns that it has expired.
func (q fileQuery) verify(operation, token string, now time.Time) error {
	if q.Signature == "" {
		return errors.New("missing signature query parameter")
	}
	var exp *int64
	if q.Expiration != "" {
		v, err := strconv.ParseInt(q.Expiration, 10, 64)
		if err != nil {
			return errors.New("invalid signature_expiration")
		}
		exp = &v
	}
	want := Signature(q.Path, operation, q.Username, token, exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(q.Signature)) != 1 {
		return errors.New("invalid signature")
	}
	if exp != nil && *exp < now.Unix() {
		return errors.New("signature is already expired")
	}
	return nil
}
