package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// ErrLimit is returned (wrapped) when a team already has the most it may.
var ErrLimit = errors.New("limit reached")

// ClaimStore keeps the places in teams' sandbox limits that creates under
// way hold, so that api processes sharing the store admit creates against
// one count: the check and the claim are one transaction.
type ClaimStore interface {
	// ClaimSandbox takes a place in team's limit for a sandbox about to
	// be created, until expires (its creator gives it back with
	// ReleaseClaim before then). It counts the team's running sandboxes
	// and unexpired claims, and when they are limit or more takes none
	// and returns ErrLimit (wrapped, with the count). An unknown or empty
	// team is ErrNotFound.
	ClaimSandbox(ctx context.Context, teamID string, limit int, expires time.Time) (claimID string, err error)
	// ReleaseClaim gives a place back; a claim already gone is no error.
	ReleaseClaim(ctx context.Context, claimID string) error
}

// LimitError is the ErrLimit of ClaimSandbox: how many the team has.
type LimitError struct{ Have, Limit int }

func (e *LimitError) Error() string {
	return fmt.Sprintf("store: the team has %d sandboxes running or starting, its limit is %d: %v", e.Have, e.Limit, ErrLimit)
}

func (e *LimitError) Unwrap() error { return ErrLimit }

func (s *SQL) ClaimSandbox(ctx context.Context, teamID string, limit int, expires time.Time) (string, error) {
	if teamID == "" {
		return "", fmt.Errorf("store: team %q: %w", teamID, ErrNotFound)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	// The team's row is the lock that serialises claims of one team on
	// PostgreSQL (at READ COMMITTED each statement after it sees the
	// claims committed before); SQLite's write transactions are
	// exclusive already.
	var id string
	if err := tx.QueryRowContext(ctx, s.q("SELECT id FROM teams WHERE id = ?"+s.forUpdate()), teamID).Scan(&id); err != nil {
		return "", notFound("team", teamID, err)
	}
	now := ms(time.Now())
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM sandbox_claims WHERE team_id = ? AND expires_at <= ?"), teamID, now); err != nil {
		return "", err
	}
	var have int
	err = tx.QueryRowContext(ctx, s.q(`SELECT
		(SELECT COUNT(*) FROM sandboxes WHERE team_id = ? AND state = ?) +
		(SELECT COUNT(*) FROM sandbox_claims WHERE team_id = ?)`), teamID, string(StateRunning), teamID).Scan(&have)
	if err != nil {
		return "", err
	}
	if have >= limit {
		return "", &LimitError{Have: have, Limit: limit}
	}
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails on Linux
	claim := hex.EncodeToString(b[:])
	if _, err := tx.ExecContext(ctx, s.q("INSERT INTO sandbox_claims (id, team_id, expires_at) VALUES (?, ?, ?)"), claim, teamID, ms(expires)); err != nil {
		return "", err
	}
	return claim, tx.Commit()
}

func (s *SQL) ReleaseClaim(ctx context.Context, claimID string) error {
	_, err := s.db.ExecContext(ctx, s.q("DELETE FROM sandbox_claims WHERE id = ?"), claimID)
	return err
}
