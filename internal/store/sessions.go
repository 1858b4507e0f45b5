package store

import (
	"context"
	"errors"
	"time"
)

// DashboardSession is a signed-in session of the web dashboard
// (internal/dashboard), kept in the store so that every api process of a
// cluster serves it, whichever signed it in.
type DashboardSession struct {
	// IDHash is the SHA-256 (hex) of the session's ID. The ID is the
	// browser's cookie and is never stored: a row signs nobody in.
	IDHash string
	// TeamID is the team whose credential the session holds, by which
	// its sessions are bounded; never empty.
	TeamID string
	// Admin: signed in with the admin token on the admin's listener.
	Admin bool
	// Mask is the credential's harmless part, shown on the page.
	Mask string
	// Credential is the credential the session acts with, sealed by the
	// dashboard; the store never sees it in clear.
	Credential string
	CreatedAt  time.Time
	ExpiresAt  time.Time
}

// ErrSessionLimit is a sign-in refused because the store holds the most
// live dashboard sessions it may.
var ErrSessionLimit = errors.New("too many dashboard sessions")

// DashboardSessionStore keeps the dashboard's sessions.
type DashboardSessionStore interface {
	// CreateDashboardSession keeps s. In the same transaction it removes
	// the sessions expired at s.CreatedAt and, while s's team has
	// maxPerTeam sessions or more, the team's oldest, so that no team can
	// fill the table for the others; then, with maxTotal live sessions
	// still kept, it keeps nothing and fails with ErrSessionLimit. An
	// empty team is an error.
	CreateDashboardSession(ctx context.Context, s DashboardSession, maxPerTeam, maxTotal int) error
	// DashboardSession finds the session whose ID hashes to idHash, if it
	// expires after now; ErrNotFound otherwise.
	DashboardSession(ctx context.Context, idHash string, now time.Time) (DashboardSession, error)
	// DeleteDashboardSession ends a session; none by that hash is no
	// error.
	DeleteDashboardSession(ctx context.Context, idHash string) error
}
