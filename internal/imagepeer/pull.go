package imagepeer

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/keylock"
	"github.com/warren-sandbox/warren/internal/layertar"
)

// Puller pulls images from the nodes that built them.
type Puller struct {
	Images *image.Store
	// Transport reaches the nodes, authenticated (noderpc.NewTransport).
	Transport http.RoundTripper
	// Addr is the internal address of node name.
	Addr func(ctx context.Context, node string) (string, error)

	pulling keylock.Locks // by image ID: one pull at a time
}

// maxRecord bounds an image record's size.
const maxRecord = 1 << 20

// Pull makes image id, built on node, present in p.Images: its layers
// (those it lacks) and its checkpoint first, then its record.
func (p *Puller) Pull(ctx context.Context, node, id string) error {
	if !image.ValidID(id) {
		return fmt.Errorf("imagepeer: invalid image id %q", id)
	}
	// Every request of the pull is signed for node, as an image pull.
	ctx = cluster.WithTarget(cluster.WithPurpose(ctx, cluster.PurposeImages), node)
	defer p.pulling.Lock(id)()
	if _, err := p.Images.Template(id); err == nil {
		return nil // another pull made it meanwhile
	}
	addr, err := p.Addr(ctx, node)
	if err != nil {
		return fmt.Errorf("imagepeer: node %s: %w", node, err)
	}
	base := "http://" + addr + Prefix
	res, err := p.get(ctx, base+"templates/"+id)
	if err != nil {
		return err
	}
	var t image.Template
	err = json.NewDecoder(io.LimitReader(res.Body, maxRecord)).Decode(&t)
	res.Body.Close()
	if err != nil || t.ID != id {
		return fmt.Errorf("imagepeer: image %s from node %s: a record that does not parse (%v)", id, node, err)
	}

	for _, l := range t.Layers {
		if !image.ValidID(l) {
			return fmt.Errorf("imagepeer: image %s names an invalid layer %q", id, l)
		}
		if p.Images.HasLayer(l) {
			continue
		}
		if err := p.pullLayer(ctx, base, node, l); err != nil {
			return err
		}
	}
	if t.Snapshot != "" && !p.Images.HasSnapshot(t.Snapshot) {
		if !image.ValidID(t.Snapshot) {
			return fmt.Errorf("imagepeer: image %s names an invalid checkpoint %q", id, t.Snapshot)
		}
		if err := p.pullSnapshot(ctx, base, node, t.Snapshot); err != nil {
			return err
		}
	}
	t.PulledFrom = node
	return p.Images.PutTemplate(&t)
}

// get asks url, a 200 or an error. The node signs its answer and the
// transport checks it, its body at its end: a layer or checkpoint changed
// on the way fails its read.
func (p *Puller) get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(HolesHeader, "1") // layers' sparse files as holes and data
	res, err := p.Transport.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("imagepeer: %s: %w", url, err)
	}
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		res.Body.Close()
		return nil, fmt.Errorf("imagepeer: %s: %s: %s", url, res.Status, b)
	}
	return res, nil
}

// pullLayer brings layer id into the image store.
func (p *Puller) pullLayer(ctx context.Context, base, node, id string) error {
	return p.fetch(ctx, base+"layers/"+id, "layer "+id+" from node "+node,
		p.Images.LayerTemp, p.Images.LayerDir(id), unpackLayer)
}

// unpackLayer unpacks a layer's tar stream into dir (layertar: nothing
// outside dir, no device but whiteouts).
func unpackLayer(in io.Reader, dir string) error {
	tr := tar.NewReader(in)
	w := layertar.NewWriter(dir)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		var content io.Reader = tr
		if v, ok := hdr.PAXRecords[sparseSizeKey]; ok {
			if hdr.Typeflag != tar.TypeReg {
				return fmt.Errorf("%q: %s on an entry that is not a regular file", hdr.Name, sparseSizeKey)
			}
			size, err := parseSparseSize(v)
			if err != nil {
				return fmt.Errorf("%q: %w", hdr.Name, err)
			}
			content = &sparseEntry{r: tr, size: size}
		}
		if err := w.Entry(hdr, content); err != nil {
			return fmt.Errorf("%q: %w", hdr.Name, err)
		}
	}
	return w.Finish()
}

// guardEvery is how many bytes of a stream a pull reads between two
// calls of the image store's space guard. What a stream unpacks to on
// disk is at most what it holds (holes travel as lengths and are not
// written), so between two checks at most this much is written.
const guardEvery = 8 << 20

// fetch gets url's stream and unpacks it into a new locked temporary dir
// (temp), which is renamed to final once the stream's digest matches the
// trailer's; what remains of a failed fetch is removed, a fetch the
// space guard stopped included. Another process that made final
// meanwhile wins.
func (p *Puller) fetch(ctx context.Context, url, what string, temp func(prefix string) (*image.TempDir, error), final string, unpack func(io.Reader, string) error) error {
	guard := p.Images.SpaceGuard()
	if guard != nil {
		if err := guard(); err != nil {
			return err
		}
	}
	tmp, err := temp(image.PullTempPrefix)
	if err != nil {
		return err
	}
	defer tmp.Close()
	res, err := p.get(ctx, url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	h := sha256.New()
	in := io.TeeReader(&guardedReader{r: res.Body, guard: guard}, h)
	if err := unpack(in, tmp.Path); err != nil {
		return fmt.Errorf("imagepeer: %s: %w", what, err)
	}
	// What follows the stream's end (nothing, from a sound node) is
	// digested too.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return err
	}
	if got, want := hex.EncodeToString(h.Sum(nil)), res.Trailer.Get(DigestTrailer); want == "" || got != want {
		return fmt.Errorf("imagepeer: %s: the stream's digest is %s, the node's %q", what, got, want)
	}
	return tmp.Commit(final)
}

// guardedReader calls guard after every guardEvery bytes read and fails
// with its error.
type guardedReader struct {
	r     io.Reader
	guard func() error
	n     int64
}

func (g *guardedReader) Read(b []byte) (int, error) {
	n, err := g.r.Read(b)
	before := g.n
	g.n += int64(n)
	if g.guard != nil && before/guardEvery != g.n/guardEvery {
		if gerr := g.guard(); gerr != nil {
			return n, gerr
		}
	}
	return n, err
}
