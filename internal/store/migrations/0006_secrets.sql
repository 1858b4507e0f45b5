-- +goose Up
-- Team secrets (issue 14). A secret's versions keep its values sealed
-- (AES-GCM with the node's key, see internal/secret): the database never
-- holds a value in clear. A name belongs to one secret of a team.
CREATE TABLE secrets (
    id               TEXT PRIMARY KEY,
    team_id          TEXT NOT NULL,
    name             TEXT NOT NULL,
    current_version  BIGINT NOT NULL,
    metadata         TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE UNIQUE INDEX secrets_by_team_name ON secrets (team_id, name);
CREATE INDEX secrets_by_team ON secrets (team_id, created_at, id);

CREATE TABLE secret_versions (
    secret_id   TEXT NOT NULL,
    version     BIGINT NOT NULL,
    value       TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (secret_id, version)
);
