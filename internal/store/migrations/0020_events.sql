-- +goose Up
-- Sandbox lifecycle events and team webhooks (issue 25).
--
-- sandbox_events is the outbox: each row is written in the transaction of
-- the sandbox change that causes it (UpdateSandbox, SetTag of a
-- snapshot), so no event is lost in a crash and none is made for a change
-- that did not commit. seq orders one sandbox's events, body is the JSON
-- payload as served and delivered (E2B's v2 shape), kept until the
-- retention period ends.
CREATE TABLE sandbox_events (
    id          TEXT PRIMARY KEY,
    team_id     TEXT NOT NULL,
    sandbox_id  TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    type        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    body        TEXT NOT NULL
);
CREATE UNIQUE INDEX sandbox_events_by_sandbox ON sandbox_events (sandbox_id, seq);
CREATE INDEX sandbox_events_by_team ON sandbox_events (team_id, created_at, seq, id);

-- A team's webhooks. secret is the signature secret sealed with the
-- node's (or cluster's) key, bound to the webhook's team and ID, events
-- is a JSON list of event types. lease_owner and lease_until (unix ms)
-- say which process delivers the webhook's events now: one at a time, so
-- that in a cluster each delivery is made by one process, in order.
CREATE TABLE webhooks (
    id           TEXT PRIMARY KEY,
    team_id      TEXT NOT NULL,
    name         TEXT NOT NULL,
    url          TEXT NOT NULL,
    enabled      INTEGER NOT NULL,
    events       TEXT NOT NULL,
    secret       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    lease_owner  TEXT NOT NULL DEFAULT '',
    lease_until  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX webhooks_by_team ON webhooks (team_id, created_at, id);

-- One row per event a webhook is to receive, written with the event
-- (for each of the team's enabled webhooks subscribed to its type).
-- state: pending, delivered or failed, attempts so far, next_at (unix
-- ms) when a pending one may be tried (retries wait).
CREATE TABLE webhook_deliveries (
    webhook_id   TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    team_id      TEXT NOT NULL,
    sandbox_id   TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    state        TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (state, webhook_id, created_at, seq);

-- Each attempt at a delivery, for GET /events/webhooks/{id}/deliveries:
-- the HTTP status (0: none), how long it took, and why it failed.
CREATE TABLE webhook_attempts (
    id           TEXT PRIMARY KEY,
    webhook_id   TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    status       INTEGER NOT NULL,
    duration_ms  BIGINT NOT NULL,
    error        TEXT NOT NULL,
    created_at   BIGINT NOT NULL
);
CREATE INDEX webhook_attempts_by_webhook ON webhook_attempts (webhook_id, created_at, id);
