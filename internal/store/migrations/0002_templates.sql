-- +goose Up
-- Templates, their builds, build logs and tags. names holds the template's
-- Names in order as a JSON list, template_names holds one row per name so
-- that a name belongs to one template and can be looked up.
CREATE TABLE templates (
    id               TEXT PRIMARY KEY,
    team_id          TEXT NOT NULL,
    names            TEXT NOT NULL,
    public           INTEGER NOT NULL,
    cpu_count        INTEGER NOT NULL,
    memory_mb        INTEGER NOT NULL,
    disk_size_mb     INTEGER NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    last_spawned_at  BIGINT NOT NULL,
    spawn_count      BIGINT NOT NULL,
    build_count      INTEGER NOT NULL,
    created_by       TEXT NOT NULL
);
CREATE INDEX templates_by_team ON templates (team_id, created_at, id);

CREATE TABLE template_names (
    name         TEXT PRIMARY KEY,
    template_id  TEXT NOT NULL
);
CREATE INDEX template_names_by_template ON template_names (template_id);

CREATE TABLE template_builds (
    id              TEXT PRIMARY KEY,
    template_id     TEXT NOT NULL,
    status          TEXT NOT NULL,
    cpu_count       INTEGER NOT NULL,
    memory_mb       INTEGER NOT NULL,
    disk_size_mb    INTEGER NOT NULL,
    envd_version    TEXT NOT NULL,
    spec            TEXT NOT NULL,
    reason_message  TEXT NOT NULL,
    reason_step     TEXT NOT NULL,
    node            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    finished_at     BIGINT NOT NULL
);
CREATE INDEX template_builds_by_template ON template_builds (template_id, created_at);
CREATE INDEX template_builds_by_status ON template_builds (status);

CREATE TABLE build_logs (
    build_id    TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    ts          BIGINT NOT NULL,
    level       TEXT NOT NULL,
    level_rank  INTEGER NOT NULL,
    step        TEXT NOT NULL,
    message     TEXT NOT NULL,
    PRIMARY KEY (build_id, seq)
);

CREATE TABLE template_tags (
    template_id  TEXT NOT NULL,
    tag          TEXT NOT NULL,
    build_id     TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (template_id, tag)
);
