// Package reqid names requests for the server log: the API and the proxy
// give each request an ID, carried in its context, and answer a 500 with
// nothing but that ID; the error is logged under it, so that no internal
// detail reaches a client. Handler puts the ID of the context a line is
// logged with on the line, so that every line a request causes (in the
// API, the proxy or the sandbox manager below them) names it, as long as
// the code logs with the request's context (slog's ...Context methods).
package reqid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
)

// Header carries a request's ID in the response.
const Header = "X-Request-Id"

// LogKey is the attribute Handler adds to a log line.
const LogKey = "request_id"

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

type ctxKey struct{}

// NewContext returns ctx carrying the request ID id.
func NewContext(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext is the request ID ctx carries, or "".
func FromContext(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}
