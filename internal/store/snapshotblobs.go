package store

import (
	"context"
	"time"
)

// SnapshotBlob records a sandbox snapshot kept in the blob store: the
// blob that holds its checkpoint and disk, and what any node needs to
// restore sandboxes from it once it has unpacked the blob.
type SnapshotBlob struct {
	// BuildID is the snapshot template's build.
	BuildID string
	TeamID  string
	// Blob is the blob's digest (sha256:...), a blob of TeamID.
	Blob string
	// Image is the image template (JSON) sandboxes restored from the
	// snapshot use, without its ID and checkpoint name.
	Image     string
	Size      int64
	CreatedAt time.Time
}

// SnapshotBlobStore keeps the records of snapshots in the blob store.
type SnapshotBlobStore interface {
	// PutSnapshotBlob records a snapshot's blob; ErrConflict if its
	// build has one already.
	PutSnapshotBlob(ctx context.Context, b SnapshotBlob) error
	// GetSnapshotBlob is the record of team's build buildID; ErrNotFound
	// for another team's, or an empty teamID.
	GetSnapshotBlob(ctx context.Context, teamID, buildID string) (SnapshotBlob, error)
	// DeleteSnapshotBlob removes team's record of build buildID;
	// removing a missing one is not an error.
	DeleteSnapshotBlob(ctx context.Context, teamID, buildID string) error
	// ListSnapshotBlobs lists every team's records (the blob collector's
	// view of what is named).
	ListSnapshotBlobs(ctx context.Context) ([]SnapshotBlob, error)
}
