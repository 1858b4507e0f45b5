package store

import (
	"context"
	"fmt"
	"time"
)

const dashboardSessionColumns = "id_hash, team_id, admin, mask, credential, created_at, expires_at"

func (s *SQL) CreateDashboardSession(ctx context.Context, ds DashboardSession, maxPerTeam, maxTotal int) error {
	if ds.TeamID == "" {
		return errNoTeam
	}
	if ds.IDHash == "" || ds.Credential == "" {
		return fmt.Errorf("store: a dashboard session needs its ID's hash and its sealed credential")
	}
	now := ms(ds.CreatedAt)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if s.d == postgresDialect {
		// Sign-ins serialise (the mode conflicts with itself, not with
		// readers), so that two at once cannot both pass the bounds.
		// SQLite's write transactions do already (_txlock=immediate).
		if _, err := tx.ExecContext(ctx, "LOCK TABLE dashboard_sessions IN SHARE ROW EXCLUSIVE MODE"); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM dashboard_sessions WHERE expires_at <= ?"), now); err != nil {
		return err
	}
	var team int
	if err := tx.QueryRowContext(ctx, s.q("SELECT COUNT(*) FROM dashboard_sessions WHERE team_id = ?"), ds.TeamID).Scan(&team); err != nil {
		return err
	}
	if over := team - maxPerTeam + 1; over > 0 {
		if _, err := tx.ExecContext(ctx, s.q("DELETE FROM dashboard_sessions WHERE id_hash IN "+
			"(SELECT id_hash FROM dashboard_sessions WHERE team_id = ? ORDER BY created_at, id_hash LIMIT ?)"), ds.TeamID, over); err != nil {
			return err
		}
	}
	var total int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM dashboard_sessions").Scan(&total); err != nil {
		return err
	}
	if total >= maxTotal {
		return fmt.Errorf("store: %w (%d)", ErrSessionLimit, maxTotal)
	}
	admin := 0
	if ds.Admin {
		admin = 1
	}
	_, err = tx.ExecContext(ctx, s.q("INSERT INTO dashboard_sessions ("+dashboardSessionColumns+") VALUES (?, ?, ?, ?, ?, ?, ?)"),
		ds.IDHash, ds.TeamID, admin, ds.Mask, ds.Credential, now, ms(ds.ExpiresAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: dashboard session: %w", ErrConflict)
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQL) DashboardSession(ctx context.Context, idHash string, now time.Time) (DashboardSession, error) {
	var ds DashboardSession
	var admin int
	var created, expires int64
	err := s.db.QueryRowContext(ctx, s.q("SELECT "+dashboardSessionColumns+" FROM dashboard_sessions WHERE id_hash = ? AND expires_at > ?"),
		idHash, ms(now)).Scan(&ds.IDHash, &ds.TeamID, &admin, &ds.Mask, &ds.Credential, &created, &expires)
	if err != nil {
		return DashboardSession{}, notFound("dashboard session", "", err)
	}
	ds.Admin, ds.CreatedAt, ds.ExpiresAt = admin != 0, fromMS(created), fromMS(expires)
	return ds, nil
}

func (s *SQL) DeleteDashboardSession(ctx context.Context, idHash string) error {
	_, err := s.db.ExecContext(ctx, s.q("DELETE FROM dashboard_sessions WHERE id_hash = ?"), idHash)
	return err
}
