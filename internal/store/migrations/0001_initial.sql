-- +goose Up
CREATE TABLE teams (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE keys (
    id          TEXT PRIMARY KEY,
    team_id     TEXT NOT NULL REFERENCES teams(id),
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    hash        TEXT NOT NULL,
    mask        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE UNIQUE INDEX keys_by_hash ON keys (kind, hash);

CREATE TABLE sandboxes (
    id                    TEXT PRIMARY KEY,
    team_id               TEXT NOT NULL REFERENCES teams(id),
    template_id           TEXT NOT NULL,
    alias                 TEXT NOT NULL,
    state                 TEXT NOT NULL,
    started_at            BIGINT NOT NULL,
    end_at                BIGINT NOT NULL,
    cpu_count             INTEGER NOT NULL,
    memory_mb             INTEGER NOT NULL,
    disk_size_mb          INTEGER NOT NULL,
    envd_version          TEXT NOT NULL,
    envd_access_token     TEXT NOT NULL,
    traffic_access_token  TEXT NOT NULL,
    metadata              TEXT NOT NULL,
    env_vars              TEXT NOT NULL,
    allow_internet_access INTEGER,
    auto_pause            INTEGER NOT NULL,
    auto_resume           INTEGER NOT NULL,
    secure                INTEGER NOT NULL,
    node                  TEXT NOT NULL,
    slot                  TEXT NOT NULL,
    runtime               TEXT NOT NULL,
    extra                 TEXT NOT NULL,
    updated_at            BIGINT NOT NULL
);
CREATE INDEX sandboxes_by_team ON sandboxes (team_id, started_at, id);
CREATE INDEX sandboxes_by_end ON sandboxes (state, end_at);
