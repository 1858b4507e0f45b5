-- +goose Up
-- A sandbox snapshot kept in the blob store (issue 27), so that it
-- outlives the node that took it: build_id is the snapshot template's
-- build, blob the sha256:... of the pack of its checkpoint and disk (a
-- blob of team_id), image the image template sandboxes restored from it
-- use (JSON: layers, user, workdir, envs, the checkpoint's envd token,
-- volume mounts), size the blob's bytes. A row is written before the
-- snapshot's build and deleted with its template (a row whose build never
-- came, after a crash between the two, is removed by the blob collector).
CREATE TABLE snapshot_blobs (
    build_id    TEXT PRIMARY KEY,
    team_id     TEXT NOT NULL,
    blob        TEXT NOT NULL,
    image       TEXT NOT NULL,
    size        BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX snapshot_blobs_by_team ON snapshot_blobs (team_id);
