-- +goose Up
-- paused_blob: the blob (sha256:...) in the blob store that holds a paused
-- sandbox's kept files (its disk image and memory checkpoint), so that it
-- resumes on any node, or '' when it is kept on its node only, or runs.
ALTER TABLE sandboxes ADD COLUMN paused_blob TEXT NOT NULL DEFAULT '';

