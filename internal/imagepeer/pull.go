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
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/layertar"
)

// Puller pulls images from the nodes that built them.
type Puller struct {
	Images *image.Store
	// Transport reaches the nodes, authenticated (noderpc.NewTransport).
	Transport http.RoundTripper
	// Addr is the internal address of node name.
	Addr func(ctx context.Context, node string) (string, error)

	mu      sync.Mutex
	pulling map[string]*sync.Mutex // by image ID: one pull at a time
}

// maxRecord bounds an image record's size.
const maxRecord = 1 << 20

// Pull makes image id, built on node, present in p.Images: its layers
// (those it lacks) and its checkpoint first, then its record.
func (p *Puller) Pull(ctx context.Context, node, id string) error {
	if !image.ValidID(id) {
		return fmt.Errorf("imagepeer: invalid image id %q", id)
	}
	p.mu.Lock()
	if p.pulling == nil {
		p.pulling = map[string]*sync.Mutex{}
	}
	m := p.pulling[id]
	if m == nil {
		m = &sync.Mutex{}
		p.pulling[id] = m
	}
	p.mu.Unlock()
	m.Lock()
	defer m.Unlock()
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
	return p.Images.PutTemplate(&t)
}

// lockDir flocks a temporary dir while it is written: image.Store's
// Cleanup spares a locked one.
func lockDir(dir string) (unlock func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("imagepeer: locking %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// get asks url, a 200 or an error.
func (p *Puller) get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
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

// pullLayer unpacks layer id into a temporary dir, checks the stream's
// digest, and renames the dir into place.
func (p *Puller) pullLayer(ctx context.Context, base, node, id string) error {
	if guard := p.Images.SpaceGuard(); guard != nil {
		if err := guard(); err != nil {
			return err
		}
	}
	tmp, err := p.Images.MkdirLayerTemp(image.PullTempPrefix)
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	unlock, err := lockDir(tmp)
	if err != nil {
		return err
	}
	defer unlock()
	res, err := p.get(ctx, base+"layers/"+id)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	h := sha256.New()
	tr := tar.NewReader(io.TeeReader(res.Body, h))
	w := layertar.NewWriter(tmp)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("imagepeer: layer %s from node %s: %w", id, node, err)
		}
		if err := w.Entry(hdr, tr); err != nil {
			return fmt.Errorf("imagepeer: layer %s from node %s: %q: %w", id, node, hdr.Name, err)
		}
	}
	if _, err := io.Copy(io.Discard, io.TeeReader(res.Body, h)); err != nil {
		return err
	}
	want := res.Trailer.Get(DigestTrailer)
	if got := hex.EncodeToString(h.Sum(nil)); want == "" || got != want {
		return fmt.Errorf("imagepeer: layer %s from node %s: the stream's digest is %s, the node's %q", id, node, got, want)
	}
	if err := w.Finish(); err != nil {
		return err
	}
	if err := os.Rename(tmp, p.Images.LayerDir(id)); err != nil {
		if p.Images.HasLayer(id) {
			return nil // another process pulled it meanwhile: ours goes
		}
		return err
	}
	done = true
	return nil
}
