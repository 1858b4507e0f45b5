package sandbox

import (
	"context"

	"github.com/warren-sandbox/warren/internal/store"
)

// nameBuildBlobs adds to named (keys "TEAM DIGEST") the team's blobs
// that templates' builds use (internal/imageblob: their images), once it
// has forgotten the records of builds that are gone or failed: those
// blobs are then garbage like any other, removed after the grace.
func nameBuildBlobs(ctx context.Context, st store.Store, team string, named map[string]bool) error {
	if _, err := st.ReleaseBuildBlobs(ctx, team); err != nil {
		return err
	}
	bs, err := st.TeamBuildBlobs(ctx, team)
	if err != nil {
		return err
	}
	for _, b := range bs {
		named[team+" "+b.Digest] = true
	}
	return nil
}
