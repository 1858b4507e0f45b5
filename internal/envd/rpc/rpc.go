// Package rpc holds the small pieces every envd Connect service shares:
// resolving the request's user into a Connect error the SDK understands, and
// the keepalive interval a streaming client asks for.
package rpc

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/internal/envd/users"
)

// DefaultKeepalive applies when a streaming request has no usable
// Keepalive-Ping-Interval header.
const DefaultKeepalive = 90 * time.Second

// KeepaliveInterval reads the Keepalive-Ping-Interval header (seconds).
func KeepaliveInterval(h http.Header) time.Duration {
	v, err := strconv.Atoi(strings.TrimSpace(h.Get("Keepalive-Ping-Interval")))
	if err != nil || v <= 0 {
		return DefaultKeepalive
	}
	return time.Duration(v) * time.Second
}

// User resolves the user a request runs as from its Basic Authorization
// header, falling back to the sandbox's default user. Unknown or malformed
// users are Connect "unauthenticated" errors with E2B's envd's messages:
// "invalid username: '<name>'" for a named user, "invalid default user:
// '<name>'" for the default one.
func User(h http.Header, s *settings.Settings) (*users.User, error) {
	name, err := users.NameFromBasicAuth(h.Get("Authorization"))
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	u, err := users.Resolve(name, s.DefaultUser())
	if err != nil {
		if errors.Is(err, users.ErrUnknownUser) {
			if name == "" {
				return nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("invalid default user: '%s'", s.DefaultUser()))
			}
			return nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("invalid username: '%s'", name))
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return u, nil
}
