package store

import (
	"context"
	"errors"
	"fmt"
)

func (s *SQL) SetDiskUse(ctx context.Context, u DiskUse) error {
	if u.TeamID == "" || u.ObjectID == "" {
		return fmt.Errorf("store: disk use of %q with no team or object", u.Kind)
	}
	switch u.Kind {
	case DiskPaused, DiskTemplate, DiskSnapshot:
	default:
		return fmt.Errorf("store: unknown disk use kind %q", u.Kind)
	}
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO disk_usage (kind, object_id, team_id, node, bytes, updated_at)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, object_id) DO UPDATE SET team_id = excluded.team_id, node = excluded.node,
			bytes = excluded.bytes, updated_at = excluded.updated_at`),
		u.Kind, u.ObjectID, u.TeamID, u.Node, u.Bytes, ms(u.UpdatedAt))
	return err
}

func (s *SQL) TeamDiskUsage(ctx context.Context, teamID string) (TeamDisk, error) {
	if teamID == "" {
		return TeamDisk{}, errors.New("store: disk usage of no team")
	}
	var d TeamDisk
	var volumesMB int64
	// Each sum is over rows whose owner is the team's and still there:
	// the owner's team, not the row's, decides.
	err := s.db.QueryRowContext(ctx, s.q(`SELECT
		(SELECT COALESCE(SUM(quota_mb), 0) FROM volumes WHERE team_id = ?),
		(SELECT COALESCE(SUM(d.bytes), 0) FROM disk_usage d JOIN sandboxes x ON x.id = d.object_id
			WHERE d.kind = 'paused' AND x.team_id = ? AND x.state = 'paused'),
		(SELECT COALESCE(SUM(d.bytes), 0) FROM disk_usage d JOIN templates t ON t.id = d.object_id
			WHERE d.kind = 'template' AND t.team_id = ?),
		(SELECT COALESCE(SUM(d.bytes), 0) FROM disk_usage d JOIN templates t ON t.id = d.object_id
			WHERE d.kind = 'snapshot' AND t.team_id = ?)`),
		teamID, teamID, teamID, teamID).Scan(&volumesMB, &d.Paused, &d.Templates, &d.Snapshots)
	d.Volumes = volumesMB << 20
	return d, err
}
