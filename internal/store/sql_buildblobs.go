package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

func (s *SQL) AddBuildBlob(ctx context.Context, b BuildBlob) error {
	if b.BuildID == "" || b.TeamID == "" || b.Digest == "" {
		return errors.New("store: a build blob needs a build, a team and a digest")
	}
	switch b.Kind {
	case BlobImage, BlobLayer, BlobSnapshot:
	default:
		return fmt.Errorf("store: unknown build blob kind %q", b.Kind)
	}
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO build_blobs (build_id, team_id, digest, kind, created_at)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT (build_id, digest) DO NOTHING`),
		b.BuildID, b.TeamID, b.Digest, b.Kind, ms(b.CreatedAt))
	return err
}

func (s *SQL) BuildBlobs(ctx context.Context, teamID, buildID string) ([]BuildBlob, error) {
	if teamID == "" || buildID == "" {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT build_id, team_id, digest, kind, created_at FROM build_blobs
		WHERE team_id = ? AND build_id = ? ORDER BY created_at, digest`), teamID, buildID)
	if err != nil {
		return nil, err
	}
	return scanBuildBlobs(rows)
}

// liveBuild is the condition on a build_blobs row b that its build
// exists and has not failed.
const liveBuild = `EXISTS (SELECT 1 FROM template_builds t WHERE t.id = b.build_id AND t.status <> 'error')`

func (s *SQL) TeamBuildBlobs(ctx context.Context, teamID string) ([]BuildBlob, error) {
	if teamID == "" {
		return nil, errors.New("store: build blobs of no team")
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT b.build_id, b.team_id, b.digest, b.kind, b.created_at FROM build_blobs b
		WHERE b.team_id = ? AND `+liveBuild+` ORDER BY b.created_at, b.digest`), teamID)
	if err != nil {
		return nil, err
	}
	return scanBuildBlobs(rows)
}

func (s *SQL) ReleaseBuildBlobs(ctx context.Context, teamID string) ([]string, error) {
	if teamID == "" {
		return nil, errors.New("store: build blobs of no team")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	released, err := digests(tx.QueryContext(ctx, s.q(`SELECT DISTINCT b.digest FROM build_blobs b
		WHERE b.team_id = ? AND NOT `+liveBuild), teamID))
	if err != nil || len(released) == 0 {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM build_blobs WHERE team_id = ? AND NOT EXISTS
		(SELECT 1 FROM template_builds t WHERE t.id = build_blobs.build_id AND t.status <> 'error')`), teamID); err != nil {
		return nil, err
	}
	kept, err := digests(tx.QueryContext(ctx, s.q(`SELECT DISTINCT digest FROM build_blobs WHERE team_id = ?`), teamID))
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, d := range kept {
		named[d] = true
	}
	var out []string
	for _, d := range released {
		if !named[d] {
			out = append(out, d)
		}
	}
	return out, nil
}

func digests(rows *sql.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

func scanBuildBlobs(rows *sql.Rows) ([]BuildBlob, error) {
	defer rows.Close()
	var out []BuildBlob
	for rows.Next() {
		var b BuildBlob
		var created int64
		if err := rows.Scan(&b.BuildID, &b.TeamID, &b.Digest, &b.Kind, &created); err != nil {
			return nil, err
		}
		b.CreatedAt = fromMS(created)
		out = append(out, b)
	}
	return out, rows.Err()
}
