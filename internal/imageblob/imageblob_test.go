package imageblob

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/store"
)

// node is one node's image store and keeper over a shared blob store.
type node struct {
	images *image.Store
	keeper *Keeper
}

func newNode(t *testing.T, blobs blobstore.Store) node {
	t.Helper()
	dir := t.TempDir()
	images, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "blobtmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	return node{images, &Keeper{Blobs: blobs, Images: images, Temp: tmp}}
}

func write(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// sparse makes a file of size with data only at its start and end.
func sparse(t *testing.T, p string, size int64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), size-4)
}

// built makes what a build leaves in an image store: a built-in layer, a
// layer of the build's (a file, a setuid file owned by another user, a
// link, a whiteout, a sparse file), a checkpoint (sparse) and the image.
func built(t *testing.T, n node) *image.Template {
	t.Helper()
	write(t, filepath.Join(n.images.LayerDir("base-v1"), "etc/os-release"), "base\n", 0o644)
	l := n.images.LayerDir("step-abc")
	write(t, filepath.Join(l, "etc/marker"), "built by the step\n", 0o640)
	write(t, filepath.Join(l, "usr/bin/tool"), "#!/bin/sh\n", 0o4755)
	if err := os.Chown(filepath.Join(l, "usr/bin/tool"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(l, "usr/bin/tool"), 0o4755); err != nil { // chown cleared it
		t.Fatal(err)
	}
	if err := os.Symlink("../etc/marker", filepath.Join(l, "usr/marker-link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(l, "etc/removed"), unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	sparse(t, filepath.Join(l, "var/big.img"), 64<<20)
	s := n.images.SnapshotDir("snap-1")
	if err := os.MkdirAll(s, 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(s, "checkpoint.img"), "memory", 0o600)
	sparse(t, filepath.Join(s, "pages.img"), 32<<20)
	img := &image.Template{ID: "build-1", Layers: []string{"base-v1", "step-abc"}, User: "user", Envs: map[string]string{"A": "b"},
		StartCmd: "sleep infinity", Snapshot: "snap-1", SnapshotToken: "tok"}
	if err := n.images.PutTemplate(img); err != nil {
		t.Fatal(err)
	}
	return img
}

type recorded struct{ kind, digest string }

func upload(t *testing.T, n node, team string, img *image.Template) (blobstore.Digest, []recorded) {
	t.Helper()
	var recs []recorded
	d, err := n.keeper.Upload(context.Background(), team, img, func(l string) bool { return l == "base-v1" },
		func(_ context.Context, kind string, d blobstore.Digest) error {
			recs = append(recs, recorded{kind, d.String()})
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return d, recs
}

// An image goes to the store (its built-in layer not) and comes back on
// another node whole: files, modes, owners, links, whiteouts, holes, the
// checkpoint and the record.
func TestUploadFetch(t *testing.T) {
	ctx := context.Background()
	blobs, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, b := newNode(t, blobs), newNode(t, blobs)
	img := built(t, a)
	d, recs := upload(t, a, "team1", img)
	kinds := []string{}
	for _, r := range recs {
		kinds = append(kinds, r.kind)
	}
	if !slices.Equal(kinds, []string{store.BlobLayer, store.BlobSnapshot, store.BlobImage}) || recs[2].digest != d.String() {
		t.Fatalf("recorded %v, manifest %s", recs, d)
	}
	infos, err := blobs.List(ctx, "team1")
	if err != nil || len(infos) != 3 {
		t.Fatalf("the store holds %d blobs (%v), want 3: a layer, a checkpoint, a manifest", len(infos), err)
	}
	for _, info := range infos {
		if info.Size > 1<<20 {
			t.Errorf("blob %s holds %d bytes: holes were stored", info.Digest, info.Size)
		}
	}
	// The same image again (its files read meanwhile): the same blobs.
	if _, err := os.ReadFile(filepath.Join(a.images.LayerDir("step-abc"), "etc/marker")); err != nil {
		t.Fatal(err)
	}
	if d2, _ := upload(t, a, "team1", img); d2 != d {
		t.Errorf("the same image stored again has another manifest: %s, then %s", d, d2)
	}
	if again, err := blobs.List(ctx, "team1"); err != nil || len(again) != 3 {
		t.Errorf("the same image stored again: %d blobs (%v), want the same 3", len(again), err)
	}

	// b has the built-in layer (setup made it), not the rest.
	write(t, filepath.Join(b.images.LayerDir("base-v1"), "etc/os-release"), "base\n", 0o644)
	if err := b.keeper.Fetch(ctx, "team1", "build-1", d, "node-a"); err != nil {
		t.Fatal(err)
	}
	got, err := b.images.Template("build-1")
	if err != nil || got.PulledFrom != "node-a" || got.SnapshotToken != "tok" || got.StartCmd != "sleep infinity" || !slices.Equal(got.Layers, img.Layers) {
		t.Fatalf("fetched record: %+v %v", got, err)
	}
	l := b.images.LayerDir("step-abc")
	if c, err := os.ReadFile(filepath.Join(l, "etc/marker")); err != nil || string(c) != "built by the step\n" {
		t.Errorf("marker: %q %v", c, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(l, "usr/bin/tool"), &st); err != nil || st.Mode&0o7777 != 0o4755 || st.Uid != 1000 || st.Gid != 1000 {
		t.Errorf("setuid tool: mode %o uid %d gid %d %v", st.Mode&0o7777, st.Uid, st.Gid, err)
	}
	if target, err := os.Readlink(filepath.Join(l, "usr/marker-link")); err != nil || target != "../etc/marker" {
		t.Errorf("link: %q %v", target, err)
	}
	if err := unix.Lstat(filepath.Join(l, "etc/removed"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d %v", st.Mode, st.Rdev, err)
	}
	for _, p := range []string{filepath.Join(l, "var/big.img"), filepath.Join(b.images.SnapshotDir("snap-1"), "pages.img")} {
		if err := unix.Stat(p, &st); err != nil || st.Blocks*512 > 1<<20 {
			t.Errorf("%s: %d bytes allocated (%v): its holes were filled", p, st.Blocks*512, err)
		}
		c, _ := os.ReadFile(p)
		if !bytes.HasPrefix(c, []byte("head")) || !bytes.HasSuffix(c, []byte("tail")) {
			t.Errorf("%s: its data is lost", p)
		}
	}
	if c, err := os.ReadFile(filepath.Join(b.images.SnapshotDir("snap-1"), "checkpoint.img")); err != nil || string(c) != "memory" {
		t.Errorf("checkpoint: %q %v", c, err)
	}
	if left := leftovers(t, b); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}

	// Another team's name for the same digest finds nothing.
	c := newNode(t, blobs)
	if err := c.keeper.Fetch(ctx, "team2", "build-1", d, "node-a"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("another team's fetch: %v", err)
	}
	if err := c.keeper.Fetch(ctx, "", "build-1", d, "node-a"); err == nil {
		t.Errorf("a fetch of no team worked")
	}
}

// leftovers lists what fetches left in a node's temporary places.
func leftovers(t *testing.T, n node) []string {
	var out []string
	for _, d := range []string{"layers", "snapshots", "blobtmp"} {
		entries, _ := os.ReadDir(filepath.Join(n.images.Dir(), d))
		for _, e := range entries {
			if d == "blobtmp" || strings.HasPrefix(e.Name(), image.PullTempPrefix) {
				out = append(out, d+"/"+e.Name())
			}
		}
	}
	return out
}

// A corrupted or truncated blob is refused before anything of it is
// unpacked; a forged manifest too; a missing built-in layer is named.
func TestFetchRefuses(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	blobs, err := blobstore.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, blobs)
	img := built(t, a)
	d, recs := upload(t, a, "team1", img)
	blobPath := func(digest string) string {
		return filepath.Join(root, "teams", "team1", "sha256", strings.TrimPrefix(digest, blobstore.DigestPrefix))
	}
	layer := blobPath(recs[0].digest)
	good, err := os.ReadFile(layer)
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() node {
		n := newNode(t, blobs)
		write(t, filepath.Join(n.images.LayerDir("base-v1"), "etc/os-release"), "base\n", 0o644)
		return n
	}
	for _, c := range []struct {
		name  string
		bytes []byte
	}{
		{"a byte changed", func() []byte { b := bytes.Clone(good); b[len(b)/2] ^= 0xff; return b }()},
		{"truncated", good[:len(good)/2]},
	} {
		if err := os.WriteFile(layer, c.bytes, 0o600); err != nil {
			t.Fatal(err)
		}
		n := fresh()
		err := n.keeper.Fetch(ctx, "team1", "build-1", d, "node-a")
		if !errors.Is(err, blobstore.ErrCorrupt) {
			t.Errorf("%s: %v", c.name, err)
		}
		t.Logf("%s: %v", c.name, err)
		if n.images.HasLayer("step-abc") {
			t.Errorf("%s: the layer was unpacked", c.name)
		}
		if _, err := n.images.Template("build-1"); err == nil {
			t.Errorf("%s: the image was recorded", c.name)
		}
		if left := leftovers(t, n); len(left) > 0 {
			t.Errorf("%s: left behind: %v", c.name, left)
		}
	}
	if err := os.WriteFile(layer, good, 0o600); err != nil {
		t.Fatal(err)
	}

	// A manifest that is another image's, or names a path for a layer,
	// stored under its own digest: refused though its digest is right.
	for _, change := range []func(m *Manifest){
		func(m *Manifest) { m.Image.ID = "build-2" },
		func(m *Manifest) { m.Image.Layers[1], m.Layers[1].ID = "../../etc", "../../etc" },
		func(m *Manifest) { m.Layers = m.Layers[:1] },
	} {
		var m Manifest
		b, _ := os.ReadFile(blobPath(d.String()))
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		change(&m)
		b, _ = json.Marshal(m)
		fd := blobstore.DigestOf(b)
		if err := blobs.Put(ctx, "team1", fd, int64(len(b)), bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		n := fresh()
		if err := n.keeper.Fetch(ctx, "team1", "build-1", fd, "node-a"); !errors.Is(err, blobstore.ErrCorrupt) {
			t.Errorf("a forged manifest: %v", err)
		}
	}

	// A node without the built-in layer says which it lacks.
	n := newNode(t, blobs)
	if err := n.keeper.Fetch(ctx, "team1", "build-1", d, "node-a"); !errors.Is(err, ErrBuiltinMissing) || !strings.Contains(err.Error(), "base-v1") {
		t.Errorf("without the built-in layer: %v", err)
	}
}

// deletingStore is a blob store in which another template's delete
// removes a blob right after a Put found it there.
type deletingStore struct {
	blobstore.Store
	victim blobstore.Digest
}

func (s *deletingStore) Put(ctx context.Context, team string, d blobstore.Digest, size int64, r io.Reader) error {
	err := s.Store.Put(ctx, team, d, size, r)
	if d == s.victim {
		s.Store.Delete(ctx, team, d)
	}
	return err
}

// An upload whose blob another template's delete removed meanwhile
// fails, naming it, rather than report an image the store lacks.
func TestUploadSeesABlobDeletedMeanwhile(t *testing.T) {
	local, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, local)
	img := built(t, a)
	_, recs := upload(t, a, "team1", img) // to learn the layer's digest
	layer, _ := blobstore.ParseDigest(recs[0].digest)
	b := newNode(t, &deletingStore{Store: local, victim: layer})
	b.keeper.Images = a.images
	_, err = b.keeper.Upload(context.Background(), "team1", img, func(l string) bool { return l == "base-v1" },
		func(context.Context, string, blobstore.Digest) error { return nil })
	if !errors.Is(err, blobstore.ErrNotFound) || !strings.Contains(err.Error(), "step-abc") {
		t.Errorf("an upload whose layer was deleted meanwhile: %v", err)
	}
}
