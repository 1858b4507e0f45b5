package sandbox

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/store"
)

// The collector spares the blobs of templates' builds that exist and
// have not failed (a build under way included), and removes those of a
// failed build and of a deleted template once past the grace.
func TestCollectSparesBuildBlobs(t *testing.T) {
	ctx := context.Background()
	st, blobs, dir := newBlobTest(t, "t1")
	now := time.Now()
	for _, tp := range []string{"kept", "deleted"} {
		if err := st.CreateTemplate(ctx, store.Template{ID: tp, TeamID: "t1", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	builds := map[string]store.BuildStatus{"ready": store.BuildReady, "building": store.BuildBuilding, "failed": store.BuildError}
	for id, status := range builds {
		if err := st.CreateBuild(ctx, store.Build{ID: id, TemplateID: "kept", Status: status, CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateBuild(ctx, store.Build{ID: "gone", TemplateID: "deleted", Status: store.BuildReady, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	digests := map[string]blobstore.Digest{}
	for _, build := range []string{"ready", "building", "failed", "gone"} {
		content := "layer of " + build
		d := blobstore.DigestOf([]byte(content))
		if err := st.AddBuildBlob(ctx, store.BuildBlob{BuildID: build, TeamID: "t1", Digest: d.String(), Kind: store.BlobLayer, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := blobs.Put(ctx, "t1", d, int64(len(content)), bytes.NewReader([]byte(content))); err != nil {
			t.Fatal(err)
		}
		old := now.Add(-2 * time.Hour)
		os.Chtimes(filepath.Join(dir, "teams", "t1", "sha256", d.Hex()), old, old)
		digests[build] = d
	}
	if err := st.DeleteTemplate(ctx, "deleted"); err != nil {
		t.Fatal(err)
	}
	n, err := CollectBlobs(ctx, st, blobs, now.Add(-DefaultBlobGCGrace))
	if err != nil || n != 2 {
		t.Fatalf("collected %d: %v", n, err)
	}
	for build, want := range map[string]bool{"ready": true, "building": true, "failed": false, "gone": false} {
		_, err := blobs.Stat(ctx, "t1", digests[build])
		if got := err == nil; got != want {
			t.Errorf("the blob of build %s kept %v, want %v (%v)", build, got, want, err)
		}
	}
}
