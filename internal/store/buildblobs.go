package store

import (
	"context"
	"time"
)

// Kinds of BuildBlob: what of a build's image a blob holds.
const (
	BlobImage    = "image"    // the image's record, which names the others
	BlobLayer    = "layer"    // one of its layers
	BlobSnapshot = "snapshot" // its start checkpoint
)

// BuildBlob says that a template build's image uses a blob of the blob
// store (internal/imageblob), of the template's team.
type BuildBlob struct {
	BuildID   string
	TeamID    string
	Digest    string // sha256:<hex>
	Kind      string
	CreatedAt time.Time
}

// BuildBlobStore records the blobs templates' images are kept in, so
// that deleting a template removes those no other build uses and the
// blob collector spares them.
type BuildBlobStore interface {
	// AddBuildBlob records that a build uses a blob (recording it again
	// is no error). Call it before the blob is stored: a blob under way
	// is then named already.
	AddBuildBlob(ctx context.Context, b BuildBlob) error
	// BuildBlobs lists the blobs of team's build. An empty team, or a
	// build of another team, has none.
	BuildBlobs(ctx context.Context, teamID, buildID string) ([]BuildBlob, error)
	// TeamBuildBlobs lists the team's blobs that builds use: those of
	// builds that exist and have not failed. An empty team ID is an
	// error: it never means every team.
	TeamBuildBlobs(ctx context.Context, teamID string) ([]BuildBlob, error)
	// ReleaseBuildBlobs forgets the team's records of builds that are
	// gone or failed, and returns the digests no remaining record names:
	// blobs to delete. An empty team ID is an error.
	ReleaseBuildBlobs(ctx context.Context, teamID string) ([]string, error)
}
