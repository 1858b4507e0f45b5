// Package settings holds the sandbox-wide defaults of envd that the platform
// sets at start and may change later through POST /init: the access token,
// the default user and working directory, and the default environment.
//
// Every envd service reads these per request, so a change (for example when a
// warm sandbox is claimed) applies to the next request without a restart.
package settings

import (
	"crypto/subtle"
	"maps"
	"sync"
)

// Settings is safe for concurrent use. The zero value is not usable; call New.
type Settings struct {
	mu          sync.RWMutex
	accessToken string
	insecure    bool // AllowNoToken was called
	user        string
	workdir     string
	envVars     map[string]string
}

// New returns settings with the given default user (e.g. "user") and default
// working directory ("" means the user's home).
func New(user, workdir, accessToken string) *Settings {
	return &Settings{user: user, workdir: workdir, accessToken: accessToken, envVars: map[string]string{}}
}

// AccessToken is the token every protected request must carry; "" means
// none is set yet (see Open).
func (s *Settings) AccessToken() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.accessToken
}

// AllowNoToken makes envd serve requests without a token while none is set
// (envd's --insecure-no-token, for a development envd on a trusted host).
// Without it, an envd with no token refuses everything but GET /health:
// anything else could be reached by any process in the sandbox or any
// neighbour on its network before the platform has set a token.
func (s *Settings) AllowNoToken() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.insecure = true
}

// Open reports whether requests need no token: none is set and
// AllowNoToken was called.
func (s *Settings) Open() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.accessToken == "" && s.insecure
}

// TokenMatches reports whether got is the access token, compared in
// constant time. It is false for every got while no token is set, so an
// empty token never matches an empty header (and never keys a signature).
func (s *Settings) TokenMatches(got string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.accessToken != "" && subtle.ConstantTimeCompare([]byte(s.accessToken), []byte(got)) == 1
}

// DefaultUser is the user requests run as when they name none.
func (s *Settings) DefaultUser() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.user
}

// DefaultWorkdir is where processes start and relative paths resolve when no
// cwd is given; "" means the user's home directory.
func (s *Settings) DefaultWorkdir() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.workdir
}

// EnvVars returns a copy of the sandbox's default environment variables.
func (s *Settings) EnvVars() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.envVars)
}

// Update carries the fields of POST /init; nil fields are left unchanged.
type Update struct {
	AccessToken *string
	User        *string
	Workdir     *string
	// EnvVars are merged into the existing defaults.
	EnvVars map[string]string
}

// Apply changes the settings atomically.
func (s *Settings) Apply(u Update) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.AccessToken != nil {
		s.accessToken = *u.AccessToken
	}
	if u.User != nil && *u.User != "" {
		s.user = *u.User
	}
	if u.Workdir != nil {
		s.workdir = *u.Workdir
	}
	maps.Copy(s.envVars, u.EnvVars)
}
