package store

import (
	"context"
	"fmt"
)

func (s *SQL) PutSnapshotBlob(ctx context.Context, b SnapshotBlob) error {
	if b.TeamID == "" || b.BuildID == "" || b.Blob == "" {
		return fmt.Errorf("store: snapshot blob of build %q with no team, build or blob", b.BuildID)
	}
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO snapshot_blobs (build_id, team_id, blob, image, size, created_at)
		VALUES (?, ?, ?, ?, ?, ?)`), b.BuildID, b.TeamID, b.Blob, b.Image, b.Size, ms(b.CreatedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: snapshot blob of build %s: %w", b.BuildID, ErrConflict)
	}
	return err
}

func (s *SQL) GetSnapshotBlob(ctx context.Context, teamID, buildID string) (SnapshotBlob, error) {
	if teamID == "" {
		return SnapshotBlob{}, fmt.Errorf("store: snapshot blob of build %s: %w", buildID, ErrNotFound)
	}
	var b SnapshotBlob
	var created int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT build_id, team_id, blob, image, size, created_at FROM snapshot_blobs
		WHERE build_id = ? AND team_id = ?`), buildID, teamID).Scan(&b.BuildID, &b.TeamID, &b.Blob, &b.Image, &b.Size, &created)
	if err != nil {
		return SnapshotBlob{}, notFound("snapshot blob of build", buildID, err)
	}
	b.CreatedAt = fromMS(created)
	return b, nil
}

func (s *SQL) DeleteSnapshotBlob(ctx context.Context, teamID, buildID string) error {
	if teamID == "" {
		return nil
	}
	_, err := s.db.ExecContext(ctx, s.q("DELETE FROM snapshot_blobs WHERE build_id = ? AND team_id = ?"), buildID, teamID)
	return err
}

func (s *SQL) ListSnapshotBlobs(ctx context.Context) ([]SnapshotBlob, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT build_id, team_id, blob, image, size, created_at FROM snapshot_blobs ORDER BY created_at, build_id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SnapshotBlob
	for rows.Next() {
		var b SnapshotBlob
		var created int64
		if err := rows.Scan(&b.BuildID, &b.TeamID, &b.Blob, &b.Image, &b.Size, &created); err != nil {
			return nil, err
		}
		b.CreatedAt = fromMS(created)
		out = append(out, b)
	}
	return out, rows.Err()
}
