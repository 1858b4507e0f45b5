-- +goose Up
-- The web dashboard's sessions (issue 26), in the store so that every api
-- process of a cluster knows a browser signed in through any of them.
--
-- id_hash is the SHA-256 (hex) of the session's ID, the browser's cookie:
-- the ID itself is never stored, so a row signs nobody in. credential is
-- the API key, access token or admin token the session acts with, sealed
-- (internal/dashboard: a key derived from the session's ID, then the
-- server's sealing key), never in clear. mask is its harmless part shown
-- on the page. admin is 0 or 1, times are unix ms. Expired rows are removed
-- by the next sign-in.
CREATE TABLE dashboard_sessions (
    id_hash     TEXT PRIMARY KEY,
    team_id     TEXT NOT NULL,
    admin       INTEGER NOT NULL,
    mask        TEXT NOT NULL,
    credential  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX dashboard_sessions_by_team ON dashboard_sessions (team_id, created_at);
CREATE INDEX dashboard_sessions_by_expiry ON dashboard_sessions (expires_at);
