package store

import (
	"context"
	"errors"
	"time"
)

// Secret is a team secret's record. Its values are kept per version,
// sealed by internal/secret; the record never holds one.
type Secret struct {
	ID             string
	TeamID         string
	Name           string // unique within the team, canonical (lower-case)
	CurrentVersion int64
	Metadata       map[string]string
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// SecretCursor is a position in a team's secrets, ordered by (CreatedAt, ID).
type SecretCursor struct {
	CreatedAt time.Time
	ID        string
}

// Bounds of what one team keeps: CreateSecret refuses a team's secret
// past MaxSecretsPerTeam with ErrSecretLimit, and AddSecretVersion drops
// versions older than the last KeptSecretVersions (only the current one
// is ever read).
const (
	MaxSecretsPerTeam  = 1000
	KeptSecretVersions = 10
)

// ErrSecretLimit is a team at MaxSecretsPerTeam.
var ErrSecretLimit = errors.New("the team has the most secrets it may keep")

// Seal seals a secret's value for a version; the store calls it inside
// the transaction that picks the version number, so that the sealed value
// can be bound to it.
type Seal func(version int64) (string, error)

// SecretStore persists team secrets. Every method is scoped by team, and
// an empty team ID is an error, never "any team".
type SecretStore interface {
	// CreateSecret records s as version 1 with the sealed value; a name
	// the team has already fails with ErrConflict.
	CreateSecret(ctx context.Context, s Secret, seal Seal) (Secret, error)
	// AddSecretVersion makes a new version of the team's secret id
	// current; metadata, if not nil, replaces the secret's.
	AddSecretVersion(ctx context.Context, teamID, id string, seal Seal, metadata map[string]string) (Secret, error)
	// GetSecret finds a team's secret by ID or by name.
	GetSecret(ctx context.Context, teamID, idOrName string) (Secret, error)
	// SecretValue returns a team's secret by name with the sealed value
	// of its current version.
	SecretValue(ctx context.Context, teamID, name string) (Secret, string, error)
	// ListSecrets lists up to limit of a team's secrets after the cursor
	// (nil: from the start), oldest first.
	ListSecrets(ctx context.Context, teamID string, after *SecretCursor, limit int) ([]Secret, error)
	// DeleteSecret removes a team's secret with every version.
	DeleteSecret(ctx context.Context, teamID, id string) error
}
