-- +goose Up
-- build_blobs: the blobs of the blob store (sha256:...) that a template
-- build's image is made of (issue 27): its record ('image'), its layers
-- ('layer') and its start checkpoint ('snapshot'), each a blob of the
-- template's team. A row is written before its blob is stored, so that a
-- blob a build is storing is always named. A row names its blob only
-- while its build exists and has not failed (the queries join
-- template_builds), so the rows of a deleted template release theirs.
CREATE TABLE build_blobs (
    build_id    TEXT NOT NULL,
    team_id     TEXT NOT NULL,
    digest      TEXT NOT NULL,
    kind        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (build_id, digest)
);
CREATE INDEX build_blobs_by_team ON build_blobs (team_id, digest);
