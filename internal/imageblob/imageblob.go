// Package imageblob keeps built templates' images in the blob store
// (internal/blobstore), so that a template outlives the node that built
// it: a node that lacks a build's image and cannot pull it from the
// builder (internal/imagepeer: the builder is lost, or its data dir was
// wiped) fetches it from the store instead.
//
// An image is kept as blobs of the template's team, each named by its
// SHA-256 and verified on the way back:
//
//   - each layer, as the tar stream nodes exchange (imagepeer.WriteLayer:
//     owners, modes, links, whiteouts, capabilities, holes as lengths),
//     unpacked on the way back by internal/layertar like any pulled
//     layer. A layer is not a blobstore pack: a pack holds only plain
//     files and directories, and a layer holds links, devices (overlay
//     whiteouts) and owners;
//   - its start checkpoint, if it has one, as a blobstore pack (a flat
//     directory of files, holes left out);
//   - its manifest, last: the image's record (image.Template) and the
//     digest of each of those blobs. The build's record in the store
//     names the manifest (store.BuildBlob, kind image), so the chain of
//     digests starts in the database: bytes changed in the blob store
//     are refused.
//
// Built-in templates' layers (base, code-interpreter-v1, mcp-gateway:
// `warren setup` and `warren serve` make them on every node, named by
// their recipe) are not uploaded: the manifest lists them without a
// digest, and a node that lacks one says so.
//
// Whose blobs. A template's blobs are its team's, also when the template
// is public: a team that may start another team's public template never
// names a key, and the node that starts it fetches the owner's blobs
// after the template service has checked that the team may use it.
package imageblob

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/imagepeer"
	"github.com/warren-sandbox/warren/internal/keylock"
	"github.com/warren-sandbox/warren/internal/store"
)

// manifestFormat marks a manifest this package wrote.
const manifestFormat = "warren-image 1"

// maxManifest bounds a manifest's size.
const maxManifest = 1 << 20

// Manifest is an image as the blob store keeps it.
type Manifest struct {
	Format string `json:"format"`
	// Image is the image's record, PulledFrom cleared.
	Image image.Template `json:"image"`
	// Layers are Image.Layers' blobs, in their order.
	Layers []Part `json:"layers"`
	// Snapshot is Image.Snapshot's checkpoint, if it has one.
	Snapshot *Part `json:"snapshot,omitempty"`
}

// Part is one layer or checkpoint of an image: its ID in the image store
// and its blob, or no blob for a built-in template's layer.
type Part struct {
	ID     string `json:"id"`
	Digest string `json:"digest,omitempty"`
	Size   int64  `json:"size,omitempty"`
}

// Keeper stores images in the blob store and fetches them back.
type Keeper struct {
	Blobs  blobstore.Store
	Images *image.Store
	// Temp is a directory of this node's for blobs on their way (the
	// data dir's blobtmp, emptied at start).
	Temp string
	Log  *slog.Logger

	fetching keylock.Locks // by build: one fetch at a time
}

// Record is told of each blob of an image before the blob is stored
// (store.BuildBlobStore.AddBuildBlob), with its kind (store.BlobLayer,
// store.BlobSnapshot, store.BlobImage).
type Record func(ctx context.Context, kind string, d blobstore.Digest) error

// Upload stores img (a build's image, whose layers and checkpoint are in
// Images) as blobs of team: its layers but those builtin says every
// node has, its checkpoint, then its manifest, whose digest it returns.
// record is called before each blob is stored.
func (k *Keeper) Upload(ctx context.Context, team string, img *image.Template, builtin func(layer string) bool, record Record) (blobstore.Digest, error) {
	if team == "" {
		return blobstore.Digest{}, errors.New("imageblob: an image of no team")
	}
	start := time.Now()
	m := Manifest{Format: manifestFormat, Image: *img}
	m.Image.PulledFrom = ""
	var bytes int64
	for _, id := range img.Layers {
		if builtin(id) {
			m.Layers = append(m.Layers, Part{ID: id})
			continue
		}
		p, err := k.put(ctx, team, store.BlobLayer, id, record, func(w io.Writer) error {
			return imagepeer.WriteLayer(w, k.Images.LayerDir(id))
		})
		if err != nil {
			return blobstore.Digest{}, fmt.Errorf("imageblob: layer %s: %w", id, err)
		}
		m.Layers = append(m.Layers, p)
		bytes += p.Size
	}
	if id := img.Snapshot; id != "" {
		p, err := k.put(ctx, team, store.BlobSnapshot, id, record, func(w io.Writer) error {
			return blobstore.Pack(w, k.Images.SnapshotDir(id))
		})
		if err != nil {
			return blobstore.Digest{}, fmt.Errorf("imageblob: checkpoint %s: %w", id, err)
		}
		m.Snapshot = &p
		bytes += p.Size
	}
	b, err := json.Marshal(m)
	if err != nil {
		return blobstore.Digest{}, err
	}
	mp, err := k.put(ctx, team, store.BlobImage, img.ID, record, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
	if err != nil {
		return blobstore.Digest{}, fmt.Errorf("imageblob: the manifest of %s: %w", img.ID, err)
	}
	parts := append(append([]Part(nil), m.Layers...), mp)
	if m.Snapshot != nil {
		parts = append(parts, *m.Snapshot)
	}
	if err := k.stillStored(ctx, team, parts); err != nil {
		return blobstore.Digest{}, err
	}
	d, _ := blobstore.ParseDigest(mp.Digest)
	k.log().Info("image stored in the blob store", "image", img.ID, "manifest", mp.Digest, "bytes", bytes+mp.Size,
		"took", time.Since(start).Round(time.Millisecond))
	return d, nil
}

// put writes what write writes to a temporary file while it hashes it,
// records the blob and stores it as a blob of team.
func (k *Keeper) put(ctx context.Context, team, kind, id string, record Record, write func(io.Writer) error) (Part, error) {
	f, err := os.CreateTemp(k.Temp, kind+"-*")
	if err != nil {
		return Part{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if err := write(bw); err != nil {
		return Part{}, err
	}
	if err := bw.Flush(); err != nil {
		return Part{}, err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return Part{}, err
	}
	d, err := blobstore.ParseDigest(blobstore.DigestPrefix + hex.EncodeToString(h.Sum(nil)))
	if err != nil {
		return Part{}, err
	}
	if err := record(ctx, kind, d); err != nil {
		return Part{}, fmt.Errorf("recording blob %s: %w", d, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Part{}, err
	}
	if err := k.Blobs.Put(ctx, team, d, size, f); err != nil {
		return Part{}, err
	}
	return Part{ID: id, Digest: d.String(), Size: size}, nil
}

// stillStored checks that every blob of parts is in the store. A delete
// of another template of the team, which released a blob just before
// this build recorded it and removed it just after Put found it there,
// would leave the image without it: it is whole only if each blob still
// is once all are stored.
func (k *Keeper) stillStored(ctx context.Context, team string, parts []Part) error {
	for _, p := range parts {
		if p.Digest == "" {
			continue // built in
		}
		d, err := blobstore.ParseDigest(p.Digest)
		if err != nil {
			return err
		}
		if _, err := k.Blobs.Stat(ctx, team, d); err != nil {
			return fmt.Errorf("imageblob: blob %s (%s) is gone from the store since it was stored (a template of the team was deleted meanwhile?); build again: %w", p.Digest, p.ID, err)
		}
	}
	return nil
}

// ErrBuiltinMissing: an image's layer is a built-in template's, which is
// not uploaded, and this node has not got it.
var ErrBuiltinMissing = errors.New("imageblob: a built-in template's layer is missing")

// Fetch makes build's image present in Images from its manifest, blob
// manifest of team: the layers it lacks and its checkpoint first, then
// its record, which names from (the node that built it) as where it
// came from. Every blob is verified against its digest (a mismatch
// wraps blobstore.ErrCorrupt) before anything of it is unpacked, and
// what a failed fetch wrote is removed.
func (k *Keeper) Fetch(ctx context.Context, team, build string, manifest blobstore.Digest, from string) error {
	if !image.ValidID(build) {
		return fmt.Errorf("imageblob: invalid image id %q", build)
	}
	unlock := k.lock(build)
	defer unlock()
	if _, err := k.Images.Template(build); err == nil {
		return nil // another fetch or a pull made it meanwhile
	}
	start := time.Now()
	m, err := k.manifest(ctx, team, build, manifest)
	if err != nil {
		return err
	}
	var fetched int64
	for _, p := range m.Layers {
		if k.Images.HasLayer(p.ID) {
			continue
		}
		if p.Digest == "" {
			return fmt.Errorf("%w: layer %s of image %s is a built-in template's, not kept in the blob store, and this node has not got it (`warren setup` makes it)", ErrBuiltinMissing, p.ID, build)
		}
		if err := k.fetchPart(ctx, team, p, k.Images.LayerTemp, "", k.Images.LayerDir(p.ID), imagepeer.UnpackLayer); err != nil {
			return fmt.Errorf("imageblob: layer %s of image %s: %w", p.ID, build, err)
		}
		fetched += p.Size
	}
	if p := m.Snapshot; p != nil && !k.Images.HasSnapshot(p.ID) {
		// blobstore.Unpack makes its directory: a subdirectory of the
		// locked temporary one.
		if err := k.fetchPart(ctx, team, *p, k.Images.SnapshotTemp, "checkpoint", k.Images.SnapshotDir(p.ID), blobstore.Unpack); err != nil {
			return fmt.Errorf("imageblob: checkpoint %s of image %s: %w", p.ID, build, err)
		}
		fetched += p.Size
	}
	img := m.Image
	img.PulledFrom = from
	if err := k.Images.PutTemplate(&img); err != nil {
		return err
	}
	k.log().Info("image fetched from the blob store", "image", build, "built_on", from, "bytes", fetched,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// manifest fetches, verifies and checks build's manifest.
func (k *Keeper) manifest(ctx context.Context, team, build string, d blobstore.Digest) (*Manifest, error) {
	info, err := k.Blobs.Stat(ctx, team, d)
	if err != nil {
		return nil, fmt.Errorf("imageblob: the manifest of image %s: %w", build, err)
	}
	if info.Size > maxManifest {
		return nil, fmt.Errorf("imageblob: the manifest of image %s: %w: %d bytes", build, blobstore.ErrCorrupt, info.Size)
	}
	tmp, err := os.MkdirTemp(k.Temp, "manifest-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	p := filepath.Join(tmp, "m")
	if err := k.Blobs.Get(ctx, team, d, p); err != nil {
		return nil, fmt.Errorf("imageblob: the manifest of image %s: %w", build, err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil || m.Format != manifestFormat {
		return nil, fmt.Errorf("imageblob: the manifest of image %s: %w: not a manifest (%v)", build, blobstore.ErrCorrupt, err)
	}
	if err := m.check(build); err != nil {
		return nil, fmt.Errorf("imageblob: the manifest of image %s: %w: %v", build, blobstore.ErrCorrupt, err)
	}
	return &m, nil
}

// check makes sure a manifest is build's and names only valid IDs and
// digests, each layer of the image once, in its order.
func (m *Manifest) check(build string) error {
	if m.Image.ID != build {
		return fmt.Errorf("it is image %q's", m.Image.ID)
	}
	if len(m.Layers) != len(m.Image.Layers) || len(m.Layers) == 0 {
		return fmt.Errorf("%d layer blobs for %d layers", len(m.Layers), len(m.Image.Layers))
	}
	parts := m.Layers
	for i, p := range m.Layers {
		if p.ID != m.Image.Layers[i] {
			return fmt.Errorf("layer %d is %q, its blob %q's", i, m.Image.Layers[i], p.ID)
		}
	}
	if (m.Snapshot == nil) != (m.Image.Snapshot == "") || (m.Snapshot != nil && m.Snapshot.ID != m.Image.Snapshot) {
		return errors.New("its checkpoint and its image's differ")
	}
	if m.Snapshot != nil {
		if m.Snapshot.Digest == "" {
			return errors.New("its checkpoint has no blob")
		}
		parts = append(parts[:len(parts):len(parts)], *m.Snapshot)
	}
	for _, p := range parts {
		if !image.ValidID(p.ID) {
			return fmt.Errorf("invalid id %q", p.ID)
		}
		if p.Digest == "" {
			continue
		}
		if _, err := blobstore.ParseDigest(p.Digest); err != nil || p.Size < 0 {
			return fmt.Errorf("%s: %v", p.ID, err)
		}
	}
	return nil
}

// fetchPart downloads p's blob (verified), unpacks it into a locked
// temporary dir that temp makes (into its sub, if set, for an unpack
// that makes its own directory) and renames that into final.
func (k *Keeper) fetchPart(ctx context.Context, team string, p Part, temp func(prefix string) (*image.TempDir, error), sub, final string, unpack func(io.Reader, string) error) error {
	d, err := blobstore.ParseDigest(p.Digest)
	if err != nil {
		return err
	}
	if guard := k.Images.SpaceGuard(); guard != nil {
		if err := guard(); err != nil {
			return err
		}
	}
	dl, err := os.MkdirTemp(k.Temp, "fetch-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dl)
	blob := filepath.Join(dl, "blob")
	if err := k.Blobs.Get(ctx, team, d, blob); err != nil {
		return fmt.Errorf("blob %s: %w", d, err)
	}
	if guard := k.Images.SpaceGuard(); guard != nil {
		if err := guard(); err != nil {
			return err
		}
	}
	f, err := os.Open(blob)
	if err != nil {
		return err
	}
	defer f.Close()
	tmp, err := temp(image.PullTempPrefix)
	if err != nil {
		return err
	}
	defer tmp.Close()
	if sub == "" {
		if err := unpack(f, tmp.Path); err != nil {
			return fmt.Errorf("unpacking blob %s: %w", d, err)
		}
		return tmp.Commit(final)
	}
	dir := filepath.Join(tmp.Path, sub)
	if err := unpack(f, dir); err != nil {
		return fmt.Errorf("unpacking blob %s: %w", d, err)
	}
	if err := unix.Syncfs(int(tmp.Dir().Fd())); err != nil {
		return err
	}
	if err := os.Rename(dir, final); err != nil {
		if _, serr := os.Lstat(final); serr != nil {
			return err
		}
	}
	return nil
}

// lock serialises the fetches of one build's image.
func (k *Keeper) lock(build string) func() { return k.fetching.Lock(build) }

func (k *Keeper) log() *slog.Logger {
	if k.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return k.Log
}
