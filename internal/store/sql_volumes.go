package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
)

const volumeColumns = "id, team_id, name, token, quota_mb, created_at"

func scanVolume(row interface{ Scan(...any) error }) (Volume, error) {
	var v Volume
	var created int64
	err := row.Scan(&v.ID, &v.TeamID, &v.Name, &v.Token, &v.QuotaMB, &created)
	v.CreatedAt = fromMS(created)
	return v, err
}

func (s *SQL) CreateVolume(ctx context.Context, v Volume) error {
	if v.TeamID == "" {
		return fmt.Errorf("store: volume %s has no team", v.ID)
	}
	_, err := s.db.ExecContext(ctx, s.q("INSERT INTO volumes ("+volumeColumns+") VALUES (?, ?, ?, ?, ?, ?)"),
		v.ID, v.TeamID, v.Name, v.Token, v.QuotaMB, ms(v.CreatedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: volume %s (%q): %w", v.ID, v.Name, ErrConflict)
	}
	return err
}

func (s *SQL) GetVolume(ctx context.Context, teamID, id string) (Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, s.q("SELECT "+volumeColumns+" FROM volumes WHERE id = ? AND team_id = ?"), id, teamID))
	return v, notFound("volume", id, err)
}

func (s *SQL) VolumeByName(ctx context.Context, teamID, name string) (Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, s.q("SELECT "+volumeColumns+" FROM volumes WHERE team_id = ? AND name = ?"), teamID, name))
	return v, notFound("volume", fmt.Sprintf("%q", name), err)
}

func (s *SQL) VolumeByID(ctx context.Context, id string) (Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, s.q("SELECT "+volumeColumns+" FROM volumes WHERE id = ?"), id))
	return v, notFound("volume", id, err)
}

func (s *SQL) ListVolumes(ctx context.Context, teamID string) ([]Volume, error) {
	return queryAll(ctx, s.db, s.q("SELECT "+volumeColumns+" FROM volumes WHERE team_id = ? ORDER BY created_at, id"), scanVolume, teamID)
}

func (s *SQL) DeleteVolume(ctx context.Context, teamID, id string, stage func() error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// The row lock makes sandboxes that are being inserted with this
	// volume (insertMounting) either visible below or fail after.
	var found string
	err = tx.QueryRowContext(ctx, s.q("SELECT id FROM volumes WHERE id = ? AND team_id = ?"+s.forUpdate()), id, teamID).Scan(&found)
	if err != nil {
		return notFound("volume", id, err)
	}
	users, err := s.mountingSandboxes(ctx, tx, teamID, id)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return &VolumeInUseError{VolumeID: id, SandboxIDs: users}
	}
	if stage != nil {
		if err := stage(); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM volumes WHERE id = ?"), id); err != nil {
		return err
	}
	return tx.Commit()
}

// mountingSandboxes lists the team's sandboxes that are not killed and
// mount volume id.
func (s *SQL) mountingSandboxes(ctx context.Context, tx *sql.Tx, teamID, id string) ([]string, error) {
	rows, err := tx.QueryContext(ctx, s.q("SELECT id, volume_mounts FROM sandboxes WHERE team_id = ? AND state IN (?, ?, ?) AND volume_mounts <> '[]' ORDER BY id"),
		teamID, string(StateCreating), string(StateRunning), string(StatePaused))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var users []string
	for rows.Next() {
		var sandboxID, raw string
		if err := rows.Scan(&sandboxID, &raw); err != nil {
			return nil, err
		}
		var mounts []VolumeMount
		if err := json.Unmarshal([]byte(raw), &mounts); err != nil {
			return nil, fmt.Errorf("store: sandbox %s volume mounts: %w", sandboxID, err)
		}
		if slices.ContainsFunc(mounts, func(m VolumeMount) bool { return m.VolumeID == id }) {
			users = append(users, sandboxID)
		}
	}
	return users, rows.Err()
}
