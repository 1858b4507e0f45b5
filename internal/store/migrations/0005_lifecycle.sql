-- +goose Up
-- Pause to disk, resume, snapshots and fork (issue 13).
-- image: what a sandbox's root filesystem and envd were made from (JSON:
-- layer IDs, user, workdir, the template's environment), so that it can
-- be resumed or forked whatever happened to its template since.
ALTER TABLE sandboxes ADD COLUMN image TEXT NOT NULL DEFAULT '';
-- auto_pause_memory: a pause on timeout keeps the memory (1) or only
-- the file system (0).
ALTER TABLE sandboxes ADD COLUMN auto_pause_memory INTEGER NOT NULL DEFAULT 1;
-- rootfs_dir and checkpoint: where a paused sandbox is kept on its node,
-- its root filesystem (with the writable layer's disk image) and the
-- checkpoint image of its memory ('' when paused without it), both ''
-- while it runs.
ALTER TABLE sandboxes ADD COLUMN rootfs_dir TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN checkpoint TEXT NOT NULL DEFAULT '';
-- snapshot_of: the sandbox a snapshot template was taken from ('' for a
-- built template).
ALTER TABLE templates ADD COLUMN snapshot_of TEXT NOT NULL DEFAULT '';
CREATE INDEX templates_snapshots ON templates (team_id, snapshot_of, created_at, id);
