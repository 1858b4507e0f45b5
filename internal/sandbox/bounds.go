package sandbox

import (
	"fmt"
	"strings"
	"time"
)

// Bounds of what a client may ask of a sandbox. The platform API applies
// them to what it is sent; the manager applies them again on every entry
// point, since in a cluster its caller is a node's RPC, and a node
// believes nothing the api did not prove.
const (
	// MaxTimeout bounds every term a sandbox is given (create, connect,
	// resume, fork, set timeout), unless Config.MaxTimeout sets another
	// bound (`warren serve --max-sandbox-timeout`).
	MaxTimeout = 24 * time.Hour
	// MaxRefresh bounds what one refresh adds.
	MaxRefresh = time.Hour
	// MaxMetadataBytes bounds a sandbox's metadata: its keys and values.
	MaxMetadataBytes = 64 << 10
	// MaxEnvVarsBytes bounds a sandbox's environment: names and values.
	MaxEnvVarsBytes = 256 << 10
)

// checkTerm refuses a term (what, e.g. "timeout") outside 0..max.
func checkTerm(what string, d, max time.Duration) error {
	if d < 0 || d > max {
		return fmt.Errorf("%w: %s must be between 0 and %d seconds", ErrInvalid, what, int(max.Seconds()))
	}
	return nil
}

// checkMetadata refuses metadata of more than MaxMetadataBytes.
func checkMetadata(md map[string]string) error {
	n := 0
	for k, v := range md {
		n += len(k) + len(v)
	}
	if n > MaxMetadataBytes {
		return fmt.Errorf("%w: metadata of %d bytes, more than %d", ErrInvalid, n, MaxMetadataBytes)
	}
	return nil
}

// checkEnvVars refuses an environment of more than MaxEnvVarsBytes, or
// with a variable the kernel's environment cannot carry as given: an
// empty name, a name with '=' or NUL, a value with NUL.
func checkEnvVars(env map[string]string) error {
	n := 0
	for k, v := range env {
		switch {
		case k == "":
			return fmt.Errorf("%w: an environment variable with an empty name", ErrInvalid)
		case strings.ContainsAny(k, "=\x00"):
			return fmt.Errorf("%w: environment variable %q: a name holds neither '=' nor NUL", ErrInvalid, k)
		case strings.ContainsRune(v, 0):
			return fmt.Errorf("%w: environment variable %q: its value holds a NUL", ErrInvalid, k)
		}
		n += len(k) + len(v)
	}
	if n > MaxEnvVarsBytes {
		return fmt.Errorf("%w: environment variables of %d bytes, more than %d", ErrInvalid, n, MaxEnvVarsBytes)
	}
	return nil
}

// maxTimeout is the longest term this manager gives a sandbox.
func (m *Manager) maxTimeout() time.Duration {
	if m.cfg.MaxTimeout > 0 {
		return m.cfg.MaxTimeout
	}
	return MaxTimeout
}
