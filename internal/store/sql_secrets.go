package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

const secretColumns = "id, team_id, name, current_version, metadata, created_at, updated_at"

var errNoTeam = errors.New("store: a team ID is required")

func scanSecret(row interface{ Scan(...any) error }) (Secret, error) {
	var s Secret
	var meta string
	var created, updated int64
	if err := row.Scan(&s.ID, &s.TeamID, &s.Name, &s.CurrentVersion, &meta, &created, &updated); err != nil {
		return s, err
	}
	s.CreatedAt, s.UpdatedAt = fromMS(created), fromMS(updated)
	if err := json.Unmarshal([]byte(meta), &s.Metadata); err != nil {
		return s, fmt.Errorf("store: secret %s metadata: %w", s.ID, err)
	}
	if s.Metadata == nil {
		s.Metadata = map[string]string{}
	}
	return s, nil
}

func (s *SQL) CreateSecret(ctx context.Context, sec Secret, seal Seal) (Secret, error) {
	if sec.TeamID == "" {
		return Secret{}, errNoTeam
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	sec.CurrentVersion, sec.CreatedAt, sec.UpdatedAt = 1, now, now
	if sec.Metadata == nil {
		sec.Metadata = map[string]string{}
	}
	meta, err := json.Marshal(sec.Metadata)
	if err != nil {
		return Secret{}, err
	}
	value, err := seal(1)
	if err != nil {
		return Secret{}, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Secret{}, err
	}
	defer tx.Rollback()
	var count int
	if err := tx.QueryRowContext(ctx, s.q("SELECT COUNT(*) FROM secrets WHERE team_id = ?"), sec.TeamID).Scan(&count); err != nil {
		return Secret{}, err
	}
	if count >= MaxSecretsPerTeam {
		return Secret{}, fmt.Errorf("store: team %s: %w (%d)", sec.TeamID, ErrSecretLimit, MaxSecretsPerTeam)
	}
	_, err = tx.ExecContext(ctx, s.q("INSERT INTO secrets ("+secretColumns+") VALUES (?, ?, ?, ?, ?, ?, ?)"),
		sec.ID, sec.TeamID, sec.Name, sec.CurrentVersion, string(meta), ms(now), ms(now))
	if isUniqueViolation(err) {
		return Secret{}, fmt.Errorf("store: secret %q: %w", sec.Name, ErrConflict)
	}
	if err != nil {
		return Secret{}, err
	}
	if _, err := tx.ExecContext(ctx, s.q("INSERT INTO secret_versions (secret_id, version, value, created_at) VALUES (?, ?, ?, ?)"),
		sec.ID, 1, value, ms(now)); err != nil {
		return Secret{}, err
	}
	return sec, tx.Commit()
}

func (s *SQL) AddSecretVersion(ctx context.Context, teamID, id string, seal Seal, metadata map[string]string) (Secret, error) {
	if teamID == "" {
		return Secret{}, errNoTeam
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Secret{}, err
	}
	defer tx.Rollback()
	sec, err := scanSecret(tx.QueryRowContext(ctx, s.q("SELECT "+secretColumns+" FROM secrets WHERE team_id = ? AND id = ?"+s.forUpdate()), teamID, id))
	if err != nil {
		return Secret{}, notFound("secret", id, err)
	}
	sec.CurrentVersion++
	sec.UpdatedAt = time.Now().UTC().Truncate(time.Millisecond)
	if metadata != nil {
		sec.Metadata = metadata
	}
	meta, err := json.Marshal(sec.Metadata)
	if err != nil {
		return Secret{}, err
	}
	value, err := seal(sec.CurrentVersion)
	if err != nil {
		return Secret{}, err
	}
	if _, err := tx.ExecContext(ctx, s.q("INSERT INTO secret_versions (secret_id, version, value, created_at) VALUES (?, ?, ?, ?)"),
		id, sec.CurrentVersion, value, ms(sec.UpdatedAt)); err != nil {
		return Secret{}, err
	}
	if _, err := tx.ExecContext(ctx, s.q("UPDATE secrets SET current_version = ?, metadata = ?, updated_at = ? WHERE id = ?"),
		sec.CurrentVersion, string(meta), ms(sec.UpdatedAt), id); err != nil {
		return Secret{}, err
	}
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM secret_versions WHERE secret_id = ? AND version <= ?"),
		id, sec.CurrentVersion-KeptSecretVersions); err != nil {
		return Secret{}, err
	}
	return sec, tx.Commit()
}

func (s *SQL) GetSecret(ctx context.Context, teamID, idOrName string) (Secret, error) {
	if teamID == "" {
		return Secret{}, errNoTeam
	}
	sec, err := scanSecret(s.db.QueryRowContext(ctx, s.q("SELECT "+secretColumns+" FROM secrets WHERE team_id = ? AND (id = ? OR name = ?)"),
		teamID, idOrName, idOrName))
	return sec, notFound("secret", idOrName, err)
}

func (s *SQL) SecretValue(ctx context.Context, teamID, name string) (Secret, string, error) {
	if teamID == "" {
		return Secret{}, "", errNoTeam
	}
	row := s.db.QueryRowContext(ctx, s.q("SELECT "+prefixed("s.", secretColumns)+", v.value FROM secrets s JOIN secret_versions v "+
		"ON v.secret_id = s.id AND v.version = s.current_version WHERE s.team_id = ? AND s.name = ?"), teamID, name)
	var value string
	sec, err := scanSecret(scanExtra{row, &value})
	if err != nil {
		return Secret{}, "", notFound("secret", name, err)
	}
	return sec, value, nil
}

// scanExtra scans a row whose last column goes into extra.
type scanExtra struct {
	row   interface{ Scan(...any) error }
	extra any
}

func (r scanExtra) Scan(dest ...any) error { return r.row.Scan(append(dest, r.extra)...) }

func (s *SQL) ListSecrets(ctx context.Context, teamID string, after *SecretCursor, limit int) ([]Secret, error) {
	if teamID == "" {
		return nil, errNoTeam
	}
	query := "SELECT " + secretColumns + " FROM secrets WHERE team_id = ?"
	args := []any{teamID}
	if after != nil {
		query += " AND (created_at > ? OR (created_at = ? AND id > ?))"
		args = append(args, ms(after.CreatedAt), ms(after.CreatedAt), after.ID)
	}
	query += " ORDER BY created_at, id"
	if limit > 0 {
		query += fmt.Sprintf(" LIMIT %d", limit)
	}
	return queryAll(ctx, s.db, s.q(query), scanSecret, args...)
}

func (s *SQL) DeleteSecret(ctx context.Context, teamID, id string) error {
	if teamID == "" {
		return errNoTeam
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, s.q("DELETE FROM secrets WHERE team_id = ? AND id = ?"), teamID, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: secret %s: %w", id, ErrNotFound)
	}
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM secret_versions WHERE secret_id = ?"), id); err != nil {
		return err
	}
	return tx.Commit()
}
