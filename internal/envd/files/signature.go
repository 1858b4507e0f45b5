package files

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

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
