package oci

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/layertar"
)

// layerError is a failure to unpack a layer's contents, as opposed to a
// failure to fetch them.
type layerError struct {
	id  string
	err error
}

func (e *layerError) Error() string { return "layer " + e.id + ": " + e.err.Error() }

func (e *layerError) Unwrap() error { return e.err }

// unpackImage unpacks img's layers that are not there yet (in team's
// scope, see ociLayerID) and returns a template (without ID) of them and
// img's config. progress may be nil; sizes says whether img's layers know
// their (compressed) size cheaply.
func unpackImage(ctx context.Context, s *image.Store, img v1.Image, team string, progress func(string, ...any), sizes bool) (*image.Template, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image config: %w", err)
	}
	if (cfg.OS != "" && cfg.OS != pullPlatform.OS) || (cfg.Architecture != "" && cfg.Architecture != pullPlatform.Architecture) {
		return nil, fmt.Errorf("the image is for %s/%s, this machine runs %s/%s", cfg.OS, cfg.Architecture, pullPlatform.OS, pullPlatform.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	// The config's diffIDs name the layers; asking each layer for its
	// DiffID could mean reading it (e.g. from an archive).
	diffIDs := cfg.RootFS.DiffIDs
	if len(diffIDs) != len(layers) {
		return nil, fmt.Errorf("the image has %d layers but its config lists %d diffIDs", len(layers), len(diffIDs))
	}
	t := templateFromConfig(cfg)
	for i, l := range layers {
		step := func(format string, args ...any) {
			if progress != nil {
				progress("layer %d/%d %s: %s", i+1, len(layers), shortHex(diffIDs[i].Hex), fmt.Sprintf(format, args...))
			}
		}
		if sizes {
			if n, err := l.Size(); err == nil {
				step = withFetchSize(step, n)
			}
		}
		id, err := unpackTeamLayer(ctx, s, team, diffIDs[i], l.Uncompressed, step)
		if err != nil {
			return nil, err
		}
		t.Layers = append(t.Layers, id)
	}
	return t, nil
}

// withFetchSize makes step's "fetching" line show the compressed size.
func withFetchSize(step func(string, ...any), n int64) func(string, ...any) {
	return func(format string, args ...any) {
		if format == "fetching" {
			step("fetching %s", humanSize(n))
			return
		}
		step(format, args...)
	}
}

// templateFromConfig is a template (without ID and layers) with the
// defaults of an image config.
func templateFromConfig(cfg *v1.ConfigFile) *image.Template {
	t := &image.Template{User: cfg.Config.User, Workdir: cfg.Config.WorkingDir}
	if t.User == "" {
		t.User = "root"
	}
	for _, kv := range cfg.Config.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if t.Envs == nil {
			t.Envs = map[string]string{}
		}
		t.Envs[k] = v
	}
	return t
}

var hexDigest = regexp.MustCompile(`^[a-f0-9]{64}$`)

// ociLayerID is the ID of the layer whose uncompressed tar has diffID,
// in team's scope: "oci-<diffID>" for the node's own (imports, operator
// pulls), "oci-<team tag>-<diffID>" for a team's pulls.
//
// A team's pulls reuse only the team's layers. Shared by diffID, a layer
// pulled by one team with its registry credentials would be handed to
// any team whose image (from a registry of its own) merely claims that
// diffID, since a layer that is present is not fetched again; and
// whether a pull fetched or not would tell a team which layers others
// have. Checking that the requesting team could fetch the blob instead
// cannot be done without fetching it: a registry the team runs may
// answer HEAD for anything, and only the content proves the diffID. So
// the key is the team, the simplest scheme that is correct; the price
// is that teams pulling the same public image each fetch and keep it.
func ociLayerID(team string, diffID v1.Hash) (string, error) {
	// The diffID comes from the image and becomes a path: check it.
	if diffID.Algorithm != "sha256" || !hexDigest.MatchString(diffID.Hex) {
		return "", fmt.Errorf("unsupported layer diffID %q", diffID)
	}
	if team == "" {
		return "oci-" + diffID.Hex, nil
	}
	h := sha256.Sum256([]byte("oci-layer-team\x00" + team))
	return "oci-" + hex.EncodeToString(h[:8]) + "-" + diffID.Hex, nil
}

// unpackLayer makes sure that the layer whose uncompressed tar has diffID
// is unpacked under layers/ and returns its ID. open, which returns the
// uncompressed tar, is called only if it is not there yet. The stream is
// hashed as it is unpacked and must match diffID. step, if not nil, gets
// progress lines.
func unpackLayer(ctx context.Context, s *image.Store, diffID v1.Hash, open func() (io.ReadCloser, error), step func(string, ...any)) (_ string, err error) {
	return unpackTeamLayer(ctx, s, "", diffID, open, step)
}

// unpackTeamLayer is unpackLayer in team's scope (see ociLayerID).
func unpackTeamLayer(ctx context.Context, s *image.Store, team string, diffID v1.Hash, open func() (io.ReadCloser, error), step func(string, ...any)) (_ string, err error) {
	if step == nil {
		step = func(string, ...any) {}
	}
	id, err := ociLayerID(team, diffID)
	if err != nil {
		return "", err
	}
	final := s.LayerDir(id)
	if _, err := os.Lstat(final); err == nil {
		step("already present")
		return id, nil
	}
	start := time.Now()
	tmp, err := s.LayerTemp(image.OCITempPrefix)
	if err != nil {
		return "", err
	}
	defer tmp.Close()

	step("fetching")
	rc, err := open()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	h := sha256.New()
	in := &countingReader{r: io.TeeReader(ctxReader{ctx, rc}, h)}
	w := layertar.NewWriter(tmp.Path)
	tr := tar.NewReader(guardedReader{in, s.SpaceGuard()})
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err // a read error of the stream, a corrupt tar, or the space guard
		}
		if err := w.Entry(hdr, tr); err != nil {
			return "", &layerError{id: id, err: fmt.Errorf("%q: %w", hdr.Name, err)}
		}
	}
	// What follows the tar's end marker is part of the diffID too.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return "", err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != diffID.Hex {
		return "", &layerError{id: id, err: fmt.Errorf("content does not match the diffID (got sha256:%s)", got)}
	}
	if err := w.Finish(); err != nil {
		return "", &layerError{id: id, err: err}
	}
	if dropped := w.DroppedDevices(); len(dropped) > 0 {
		step("left out %d device node(s) (a sandbox's /dev is its own), e.g. /%s", len(dropped), dropped[0])
	}
	// Another pull that unpacked the same layer meanwhile wins.
	if err := tmp.Commit(final); err != nil {
		return "", err
	}
	step("unpacked %s in %.1fs", humanSize(in.n), time.Since(start).Seconds())
	return id, nil
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// unpackGuardEvery is how many uncompressed bytes an unpack reads between
// two calls of the store's space guard.
const unpackGuardEvery = 64 << 20

// guardedReader asks guard, after every unpackGuardEvery bytes read
// through the counting reader, whether the unpack may go on. What a layer
// unpacks to is at most what its tar holds (sparse entries are refused),
// so counting the tar bounds the writes between two checks.
type guardedReader struct {
	c     *countingReader
	guard func() error
}

func (g guardedReader) Read(p []byte) (int, error) {
	before := g.c.n
	n, err := g.c.Read(p)
	if g.guard != nil && before/unpackGuardEvery != g.c.n/unpackGuardEvery {
		if gerr := g.guard(); gerr != nil {
			return n, gerr
		}
	}
	return n, err
}

// ctxReader ends a read (a download, an unpack) when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func humanSize(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

func shortHex(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
