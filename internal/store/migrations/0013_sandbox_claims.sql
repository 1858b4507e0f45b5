-- +goose Up
-- A place in a team's sandbox limit, taken by an api process for a create
-- it is about to send to a node (ClaimSandbox) and given back when the
-- node has answered. A claim whose api process died is ignored once
-- expires_at (unix ms) has passed.
CREATE TABLE sandbox_claims (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    expires_at BIGINT NOT NULL
);
CREATE INDEX sandbox_claims_by_team ON sandbox_claims (team_id, expires_at);
