package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// Snapshots that outlive their node.
//
// With a blob store, a snapshot is answered only once its directory (the
// checkpoint and the copy of its disk) is a blob of its team and a record
// of the store names it beside its build (store.SnapshotBlob, written
// before the build, with the image template its sandboxes use). A node
// that must start a sandbox from a snapshot it lacks pulls it from the
// node that took it (Resolve's image); when that fails (the node is lost,
// or its data dir is gone) it fetches the blob, verified, unpacks it into
// its snapshots/ and records the image as pulled (so that it goes when
// the template is deleted). The blob is read with the template's team,
// once the caller was found to see the template: no one names a key.
// Deleting the snapshot's template deletes the record with it, and then
// the blob; a blob left by a failure is the blob collector's
// (sandbox.CollectBlobs).

// snapshotBlobs keeps snapshots in the blob store: the sandbox manager.
type snapshotBlobs interface {
	StoreSnapshot(ctx context.Context, teamID, dir string) (digest string, size int64, err error)
	FetchSnapshot(ctx context.Context, teamID, digest, dir string) error
	DropSnapshotBlob(teamID, digest string)
}

// blobs is the sandbox manager as a snapshotBlobs, or nil.
func (b *Builder) blobs() snapshotBlobs {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb, _ := b.sandboxes.(snapshotBlobs)
	return sb
}

// storeSnapshot puts a snapshot just taken into the blob store and
// records it beside build buildID (without a blob store it does
// nothing). undo removes the record and the blob again, for a snapshot
// that is not recorded after all.
func (b *Builder) storeSnapshot(ctx context.Context, teamID, buildID, snapID string, snap sandbox.Snapshot) (undo func(), err error) {
	undo = func() {}
	sb := b.blobs()
	if sb == nil {
		return undo, nil
	}
	digest, size, err := sb.StoreSnapshot(ctx, teamID, b.cfg.Images.SnapshotDir(snapID))
	if err != nil || digest == "" {
		return undo, err
	}
	img := snap.Image
	img.ID, img.Snapshot = "", ""
	js, err := json.Marshal(img)
	if err != nil {
		sb.DropSnapshotBlob(teamID, digest)
		return undo, err
	}
	ctx = context.WithoutCancel(ctx)
	rec := store.SnapshotBlob{BuildID: buildID, TeamID: teamID, Blob: digest, Image: string(js), Size: size, CreatedAt: time.Now()}
	if err := b.cfg.Store.PutSnapshotBlob(ctx, rec); err != nil {
		sb.DropSnapshotBlob(teamID, digest)
		return undo, err
	}
	return func() {
		if err := b.cfg.Store.DeleteSnapshotBlob(ctx, teamID, buildID); err == nil {
			sb.DropSnapshotBlob(teamID, digest)
		}
	}, nil
}

// imageFromBlob is build bd's image (of template t) made from its
// snapshot's blob, when the image is not here and could not be pulled
// (cause); cause itself when the build has no blob.
func (b *Builder) imageFromBlob(ctx context.Context, t store.Template, bd store.Build, cause error) (*image.Template, error) {
	sb := b.blobs()
	if sb == nil {
		return nil, cause
	}
	rec, err := b.cfg.Store.GetSnapshotBlob(ctx, t.TeamID, bd.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, cause
	}
	if err != nil {
		return nil, err
	}
	unlock := b.lockFetch(bd.ID)
	defer unlock()
	if img, err := b.cfg.Images.Template(bd.ID); err == nil {
		return img, nil // fetched meanwhile
	}
	var img image.Template
	if err := json.Unmarshal([]byte(rec.Image), &img); err != nil {
		return nil, fmt.Errorf("template: the record of snapshot build %s does not parse: %w", bd.ID, err)
	}
	for _, l := range img.Layers {
		if !image.ValidID(l) {
			return nil, fmt.Errorf("template: snapshot build %s names an invalid layer %q", bd.ID, l)
		}
		if !b.cfg.Images.HasLayer(l) {
			return nil, fmt.Errorf("%w: snapshot build %s: its layer %s is not on this node, and could not be pulled (%w)", ErrNotFound, bd.ID, l, cause)
		}
	}
	snapID := snapshotDirPrefix + bd.ID
	if !b.cfg.Images.HasSnapshot(snapID) {
		start := time.Now()
		if err := b.fetchSnapshot(ctx, sb, t.TeamID, rec.Blob, snapID); err != nil {
			return nil, fmt.Errorf("template: snapshot build %s from the blob store: %w", bd.ID, err)
		}
		b.log.InfoContext(ctx, "template: fetched a snapshot from the blob store (its node could not give it)", "build", bd.ID,
			"template", t.ID, "node", bd.Node, "blob", rec.Blob, "took", time.Since(start).Round(time.Millisecond), "pull_err", cause)
	}
	img.ID, img.Snapshot, img.PulledFrom = bd.ID, snapID, bd.Node
	if err := b.cfg.Images.PutTemplate(&img); err != nil {
		return nil, err
	}
	return b.cfg.Images.Template(bd.ID)
}

// fetchSnapshot unpacks team's blob digest into snapshots/snapID: into a
// locked temporary dir first, renamed into place once whole and synced.
func (b *Builder) fetchSnapshot(ctx context.Context, sb snapshotBlobs, teamID, digest, snapID string) error {
	tmp, err := b.cfg.Images.SnapshotTemp("fetch-")
	if err != nil {
		return err
	}
	defer tmp.Close()
	dir := filepath.Join(tmp.Path, "snapshot")
	if err := sb.FetchSnapshot(ctx, teamID, digest, dir); err != nil {
		return err
	}
	if err := unix.Syncfs(int(tmp.Dir().Fd())); err != nil {
		return err
	}
	if err := os.Rename(dir, b.cfg.Images.SnapshotDir(snapID)); err != nil && !b.cfg.Images.HasSnapshot(snapID) {
		return err
	}
	return nil
}

// lockFetch serialises the fetches of one build's snapshot.
func (b *Builder) lockFetch(buildID string) (unlock func()) { return b.fetching.Lock(buildID) }

// snapshotBlobsOf reads the blob records of a template's builds before
// it is deleted (the delete removes them).
func (b *Builder) snapshotBlobsOf(ctx context.Context, t store.Template, builds []store.Build) []store.SnapshotBlob {
	var out []store.SnapshotBlob
	for _, bd := range builds {
		if rec, err := b.cfg.Store.GetSnapshotBlob(ctx, t.TeamID, bd.ID); err == nil {
			out = append(out, rec)
		}
	}
	return out
}

// dropSnapshotBlobs removes the blobs of a deleted template's snapshots,
// but one another record still names (the same bytes, snapshotted twice).
func (b *Builder) dropSnapshotBlobs(ctx context.Context, recs []store.SnapshotBlob) error {
	sb := b.blobs()
	if sb == nil || len(recs) == 0 {
		return nil
	}
	all, err := b.cfg.Store.ListSnapshotBlobs(ctx)
	if err != nil {
		return err // the collector removes them once unnamed
	}
	named := map[string]bool{}
	for _, r := range all {
		named[r.TeamID+" "+r.Blob] = true
	}
	for _, r := range recs {
		if !named[r.TeamID+" "+r.Blob] {
			sb.DropSnapshotBlob(r.TeamID, r.Blob)
		}
	}
	return nil
}

// The sandbox manager keeps snapshots in the blob store (checked here, as
// blobs finds it by a type assertion).
var _ snapshotBlobs = (*sandbox.Manager)(nil)

// noImage is Resolve's error for a build whose image is not here and
// could not be had: the detail, which names nodes' internal addresses,
// goes to the log only. A snapshot blob that does not match its digest
// is refused as an internal error, not as a missing template.
func (b *Builder) noImage(ctx context.Context, ref string, bd store.Build, err error) error {
	b.log.WarnContext(ctx, "template: a build's image is not on this node and could not be had", "build", bd.ID, "node", bd.Node, "err", err)
	if errors.Is(err, blobstore.ErrCorrupt) {
		return fmt.Errorf("template %q: build %s: its snapshot's blob in the blob store is corrupt, refused: %w", ref, bd.ID, err)
	}
	return fmt.Errorf("%w: template %q: build %s has no image on this node, and the node that made it (%s) could not give it", ErrNotFound, ref, bd.ID, bd.Node)
}
