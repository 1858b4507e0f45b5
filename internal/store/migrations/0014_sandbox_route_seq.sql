-- +goose Up
-- Which sandboxes changed how they are routed (created, or their state,
-- autoResume or envd token changed), in commit order: each such write
-- takes the next value of the one-row sandbox_route_seq (whose row lock
-- orders concurrent writers on PostgreSQL) into its row's route_seq, so
-- that an api process keeps its map of envd tokens for signed URLs by
-- reading only the rows past the last value it saw (SandboxRoutes).
ALTER TABLE sandboxes ADD COLUMN route_seq BIGINT NOT NULL DEFAULT 0;
UPDATE sandboxes SET route_seq = 1;
CREATE INDEX sandboxes_by_route_seq ON sandboxes (route_seq);
CREATE TABLE sandbox_route_seq (
    id INTEGER PRIMARY KEY,
    seq BIGINT NOT NULL
);
INSERT INTO sandbox_route_seq (id, seq) VALUES (1, 1);
