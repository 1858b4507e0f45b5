package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/imageblob"
	"github.com/warren-sandbox/warren/internal/store"
)

// blobNode is a builder of a cluster's node over a shared blob store.
func blobNode(t *testing.T, st store.Store, blobs blobstore.Store, name string, pull func(ctx context.Context, node, id string) error) *Builder {
	t.Helper()
	dir := t.TempDir()
	b := newUploadBuilder(t, st, dir, func(c *Config) { c.NodeName, c.Pull = name, pull })
	tmp := filepath.Join(dir, "blobtmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	// Every node has the built-in base (warren setup).
	base := &image.Template{ID: "base", Layers: []string{"base-r1"}, Recipe: "r1"}
	if err := os.MkdirAll(filepath.Join(b.cfg.Images.LayerDir("base-r1"), "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := b.cfg.Images.PutTemplate(base); err != nil {
		t.Fatal(err)
	}
	b.UseBlobStore(&imageblob.Keeper{Blobs: blobs, Images: b.cfg.Images, Temp: tmp})
	return b
}

// A build stored by n1 (its own layer, not base's) starts on n2 when n1
// cannot be pulled from; another team reaches it only once it is
// public; a corrupted blob is refused as unavailable, saying so;
// deleting the template removes its blobs.
func TestImageFromTheBlobStore(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	addTeam(t, st, "t2")
	root := t.TempDir()
	blobs, err := blobstore.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	n1 := blobNode(t, st, blobs, "n1", nil)
	pulls := 0
	n2 := blobNode(t, st, blobs, "n2", func(ctx context.Context, node, id string) error {
		pulls++
		return errors.New("dial tcp: connection refused")
	})

	c := newTemplate(t, n1, "t1", "stored")
	tpl, err := st.GetTemplate(ctx, c.Template.ID)
	if err != nil {
		t.Fatal(err)
	}
	bd, err := st.UpdateBuild(ctx, c.BuildID, func(bd *store.Build) error { bd.Node = "n1"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	layer := n1.cfg.Images.LayerDir("step-1")
	if err := os.MkdirAll(filepath.Join(layer, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "etc/marker"), []byte("step 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := &image.Template{ID: c.BuildID, Layers: []string{"base-r1", "step-1"}, User: "user"}
	if err := n1.storeImage(ctx, newSinkLog(func([]store.BuildLogEntry) {}), tpl, bd, img); err != nil {
		t.Fatal(err)
	}
	if err := n1.cfg.Images.PutTemplate(img); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateBuild(ctx, c.BuildID, func(bd *store.Build) error { bd.Status = store.BuildReady; return nil }); err != nil {
		t.Fatal(err)
	}
	recs, err := st.BuildBlobs(ctx, "t1", c.BuildID)
	if err != nil || len(recs) != 2 {
		t.Fatalf("the build's blobs: %+v %v (want its layer and its manifest; base is built in)", recs, err)
	}

	// Another team: not while the template is private.
	if _, err := n2.Resolve(ctx, "t2", c.Template.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team's resolve of a private template: %v", err)
	}
	if _, err := n2.cfg.Images.Template(c.BuildID); err == nil {
		t.Fatal("another team's resolve brought the image")
	}

	// A corrupted layer blob: refused, unavailable, saying so.
	var layerBlob string
	for _, r := range recs {
		if r.Kind == store.BlobLayer {
			layerBlob = filepath.Join(root, "teams", "t1", "sha256", strings.TrimPrefix(r.Digest, blobstore.DigestPrefix))
		}
	}
	good, err := os.ReadFile(layerBlob)
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 1
	if err := os.WriteFile(layerBlob, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := n2.Resolve(ctx, "t1", "stored"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("with a corrupted layer blob: %v", err)
	}
	if err := os.WriteFile(layerBlob, good, 0o600); err != nil {
		t.Fatal(err)
	}

	r, err := n2.Resolve(ctx, "t1", "stored")
	if err != nil || r.Image.User != "user" || r.Image.PulledFrom != "n1" {
		t.Fatalf("resolved on n2: %+v %v", r, err)
	}
	if b, err := os.ReadFile(filepath.Join(n2.cfg.Images.LayerDir("step-1"), "etc/marker")); err != nil || string(b) != "step 1" {
		t.Errorf("the layer on n2: %q %v", b, err)
	}
	if pulls == 0 {
		t.Error("n2 never tried the node that built it first")
	}

	// Public, another team starts it, from the owner's blobs.
	if _, err := st.UpdateTemplate(ctx, c.Template.ID, func(t *store.Template) error { t.Public = true; return nil }); err != nil {
		t.Fatal(err)
	}
	n3 := blobNode(t, st, blobs, "n3", nil)
	if r, err := n3.Resolve(ctx, "t2", "t1/stored"); err != nil || r.BuildID != c.BuildID {
		t.Errorf("another team's resolve of the public template: %+v %v", r, err)
	}

	// Deleted: its blobs go.
	if err := n1.Delete(ctx, "t1", c.Template.ID); err != nil {
		t.Fatal(err)
	}
	if left, err := blobs.List(ctx, "t1"); err != nil || len(left) != 0 {
		t.Errorf("after the delete the store holds %+v %v", left, err)
	}
}
