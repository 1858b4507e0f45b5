package template

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/imageblob"
	"github.com/warren-sandbox/warren/internal/store"
)

// Built images in the blob store (--blob-store; internal/imageblob).
//
// With a blob store, a build is ready only once its image (its layers
// but the built-in templates', its start checkpoint, and a manifest that
// names them) is stored as blobs of the template's team, each recorded
// in the store (store.BuildBlob) before it is put. A node that must start
// a build it has not got pulls it from the node that built it, as
// without a store, or, when that fails (the builder is lost, or came back
// with an empty data dir), fetches it from the blob store: the template's
// team's blobs, reached only after the caller's team was found allowed to
// use the template (its own, or public). Deleting a template releases its
// builds' records and removes the blobs no other build of the team uses;
// the blob collector (sandbox.CollectBlobs) spares the blobs of builds
// that exist and have not failed, and removes the rest after its grace.

// UseBlobStore makes builds store their images with k, and the images
// this node lacks come from k when no peer has them. Call it before
// Start.
func (b *Builder) UseBlobStore(k *imageblob.Keeper) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.imageBlobs = k
}

func (b *Builder) blobKeeper() *imageblob.Keeper {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.imageBlobs
}

// storeImage stores build bd's image img as blobs of t's team, if there
// is a blob store.
func (b *Builder) storeImage(ctx context.Context, lg *buildLog, t store.Template, bd store.Build, img *image.Template) error {
	k := b.blobKeeper()
	if k == nil {
		return nil
	}
	start := time.Now()
	builtin := b.builtinLayers()
	record := func(ctx context.Context, kind string, d blobstore.Digest) error {
		return b.cfg.Store.AddBuildBlob(ctx, store.BuildBlob{BuildID: bd.ID, TeamID: t.TeamID, Digest: d.String(), Kind: kind, CreatedAt: time.Now()})
	}
	d, err := k.Upload(ctx, t.TeamID, img, func(l string) bool { return builtin[l] }, record)
	if err != nil {
		return err
	}
	lg.info("image stored in the blob store (%s) in %.1fs", d, time.Since(start).Seconds())
	return nil
}

// builtinLayers are the layers of this node's built-in templates (base,
// code-interpreter-v1, mcp-gateway) as their recipes made them: every
// node makes the same (`warren setup`, `warren serve`), named by the
// recipe, so an image's copy in the blob store leaves them out. A
// built-in template's start snapshot layer is not among them: each node
// takes its own, when it can.
func (b *Builder) builtinLayers() map[string]bool {
	out := map[string]bool{}
	for _, id := range []string{baseimage.TemplateID, baseimage.CodeInterpreterID, baseimage.MCPGatewayID} {
		img, err := b.cfg.Images.Template(id)
		if err != nil || img.Recipe == "" {
			continue
		}
		for _, l := range image.BuiltLayers(img) {
			out[l] = true
		}
	}
	return out
}

// errNoImageBlob: a build whose image is not in the blob store (it was
// built without one).
var errNoImageBlob = errors.New("its image is not in the blob store")

// fetchImage fetches build bd of template t from the blob store: t's
// team's blobs. The caller has checked that its team may use t.
func (b *Builder) fetchImage(ctx context.Context, t store.Template, bd store.Build) error {
	k := b.blobKeeper()
	if k == nil || t.TeamID == "" {
		return errNoImageBlob
	}
	blobs, err := b.cfg.Store.BuildBlobs(ctx, t.TeamID, bd.ID)
	if err != nil {
		return err
	}
	for _, bl := range blobs {
		if bl.Kind != store.BlobImage {
			continue
		}
		d, err := blobstore.ParseDigest(bl.Digest)
		if err != nil {
			return err
		}
		return k.Fetch(ctx, t.TeamID, bd.ID, d, bd.Node)
	}
	return errNoImageBlob
}

// releaseBlobs removes the team's blobs that no build uses any more
// (its template was deleted); what fails here the blob collector
// removes later.
func (b *Builder) releaseBlobs(ctx context.Context, teamID string) error {
	k := b.blobKeeper()
	if k == nil || teamID == "" {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	ds, err := b.cfg.Store.ReleaseBuildBlobs(ctx, teamID)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range ds {
		d, err := blobstore.ParseDigest(s)
		if err != nil {
			continue
		}
		if err := k.Blobs.Delete(ctx, teamID, d); err != nil {
			errs = append(errs, fmt.Errorf("removing blob %s: %w", s, err))
		}
	}
	if len(ds) > 0 {
		b.log.InfoContext(ctx, "template: removed the blobs of deleted templates' images", "team", teamID, "blobs", len(ds))
	}
	return errors.Join(errs...)
}
