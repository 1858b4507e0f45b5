-- +goose Up
-- When a sandbox was paused (unix ms, 0 while it runs): paused sandboxes
-- are removed once they have been paused longer than the retention.
ALTER TABLE sandboxes ADD COLUMN paused_at BIGINT NOT NULL DEFAULT 0;
