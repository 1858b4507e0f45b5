-- +goose Up
-- What a team's things take of its nodes' disks (issue 22's team disk
-- quota), beyond its volumes (whose quota_mb is their size): a paused
-- sandbox's kept files (kind 'paused', object_id the sandbox's ID) and a
-- template's latest build or snapshot (kind 'template' or 'snapshot',
-- object_id the template's ID), in bytes, measured by the node when it
-- made them. A row counts only while its sandbox is paused or its
-- template exists (the team usage query joins them), so a row left by a
-- crash never counts.
CREATE TABLE disk_usage (
    kind        TEXT NOT NULL,
    object_id   TEXT NOT NULL,
    team_id     TEXT NOT NULL,
    node        TEXT NOT NULL,
    bytes       BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (kind, object_id)
);
CREATE INDEX disk_usage_by_team ON disk_usage (team_id);
