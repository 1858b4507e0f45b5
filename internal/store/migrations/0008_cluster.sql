-- +goose Up
-- The nodes that run sandboxes. Each registers at start (its address,
-- runtime and capacity), and heartbeats with what it uses. The state is
-- what operators set: ready, cordoned (no new sandboxes) or draining (no
-- new sandboxes, and its running ones are paused). A node is lost when
-- its heartbeat is older than the reader's timeout, which is computed
-- where nodes are read, never stored.
CREATE TABLE nodes (
    name            TEXT PRIMARY KEY,
    address         TEXT NOT NULL,
    runtime         TEXT NOT NULL,
    cpus            INTEGER NOT NULL,
    memory_mb       INTEGER NOT NULL,
    max_sandboxes   INTEGER NOT NULL,
    state           TEXT NOT NULL DEFAULT 'ready',
    registered_at   BIGINT NOT NULL,
    heartbeat_at    BIGINT NOT NULL,
    sandboxes       INTEGER NOT NULL DEFAULT 0,
    used_cpus       INTEGER NOT NULL DEFAULT 0,
    used_memory_mb  INTEGER NOT NULL DEFAULT 0
);
