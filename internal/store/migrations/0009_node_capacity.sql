-- +goose Up
-- What a node registers and heartbeats beyond 0008: the size of its data
-- dir's file system and its labels ("KEY=VALUE,..."), the free space
-- there, and its warm sandboxes by template ("ID=COUNT,...": the api
-- places a create where one waits).
ALTER TABLE nodes ADD COLUMN disk_mb INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN free_disk_mb INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN warm TEXT NOT NULL DEFAULT '';
