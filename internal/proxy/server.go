package proxy

import (
	"net/http"
	"time"
)

// The proxy's connection limits. It carries streams that may last hours
// (a command's output, a WebSocket, a long upload), so it has neither a
// read nor a write timeout; a client must still send its headers in time
// and an idle kept-alive connection is closed.
const (
	ReadHeaderTimeout = 10 * time.Second
	IdleTimeout       = 2 * time.Minute
	MaxHeaderBytes    = 64 << 10
)

// NewHTTPServer returns the proxy's server for h (from New).
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
