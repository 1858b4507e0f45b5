-- +goose Up
-- The warm sandboxes a node holds, as of its heartbeat, by template:
-- "ID=COUNT,..." (the api places a create where one waits).
ALTER TABLE nodes ADD COLUMN warm TEXT NOT NULL DEFAULT '';
