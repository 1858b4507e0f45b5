-- +goose Up
-- Team volumes. A volume's name is unique within its team, token opens the
-- volume content API for this volume only, and quota_mb is the size of the
-- volume's own file system (0: a plain directory, no limit of its own).
CREATE TABLE volumes (
    id          TEXT PRIMARY KEY,
    team_id     TEXT NOT NULL REFERENCES teams(id),
    name        TEXT NOT NULL,
    token       TEXT NOT NULL,
    quota_mb    INTEGER NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE UNIQUE INDEX volumes_by_team_name ON volumes (team_id, name);

-- The volumes a sandbox mounts, as a JSON list of {volumeID, name, path}.
-- A volume is not deleted while a sandbox that is not killed lists it.
ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]';
