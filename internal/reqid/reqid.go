// Package reqid names requests for the server log: the API and the proxy
// answer a 500 with nothing but the request's ID, and log the error under
// it, so that no internal detail reaches a client.
package reqid

import (
	"crypto/rand"
	"encoding/hex"
)

// Header carries a request's ID in the response.
const Header = "X-Request-Id"

// New returns a fresh request ID: 16 hex digits.
func New() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// InternalMessage is the whole message of a 500.
func InternalMessage(id string) string {
	return "internal error (request " + id + ")"
}
