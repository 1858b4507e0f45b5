package oci

// Image archives: `docker save` tarballs and OCI layouts in a tar.

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// maxArchiveJSON bounds the JSON documents (index, manifests, configs)
// read from an archive into memory.
const maxArchiveJSON = 16 << 20

// imageArchive is an image archive file: a tar, possibly gzip-compressed,
// read entry by entry. It is scanned again for each file wanted, which
// for an uncompressed archive skips over other entries' contents by
// seeking, so it costs little, and unpacks nothing to disk.
type imageArchive struct {
	path string
	gz   bool
}

func openArchive(p string) (*imageArchive, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	defer f.Close()
	magic := make([]byte, 2)
	if _, err := io.ReadFull(f, magic); err != nil {
		return nil, fmt.Errorf("oci: %s is not an image archive: %w", p, err)
	}
	return &imageArchive{path: p, gz: magic[0] == 0x1f && magic[1] == 0x8b}, nil
}

// reader returns the archive's tar stream.
func (a *imageArchive) reader() (io.ReadCloser, error) {
	f, err := os.Open(a.path)
	if err != nil {
		return nil, err
	}
	if !a.gz {
		return f, nil
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return readCloser{z, func() error { z.Close(); return f.Close() }}, nil
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

// archiveName is an entry's name as the archive formats refer to it.
func archiveName(n string) string { return strings.TrimPrefix(path.Clean(n), "/") }

// names lists the archive's regular files.
func (a *imageArchive) names() (map[string]bool, error) {
	rc, err := a.reader()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	out := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", a.path, err)
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA {
			out[archiveName(hdr.Name)] = true
		}
	}
}

// open returns the contents of the archive's regular file n.
func (a *imageArchive) open(n string) (io.ReadCloser, error) {
	rc, err := a.reader()
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			rc.Close()
			return nil, fmt.Errorf("%s is not in the archive", n)
		}
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("reading %s: %w", a.path, err)
		}
		if (hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA) && archiveName(hdr.Name) == n {
			return readCloser{tr, rc.Close}, nil
		}
	}
}

// readJSON decodes the archive's file n into v.
func (a *imageArchive) readJSON(n string, v any) ([]byte, error) {
	rc, err := a.open(n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxArchiveJSON+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxArchiveJSON {
		return nil, fmt.Errorf("%s is too large", n)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("%s: %w", n, err)
	}
	return b, nil
}

// image returns the archive's image, telling the two formats apart by
// their index files: an OCI layout has oci-layout and index.json, a
// `docker save` tarball manifest.json (Docker 25 and later write both,
// and either will do). norm, the name it is imported as, picks one of
// several images for this platform.
func (a *imageArchive) image(norm string) (v1.Image, error) {
	names, err := a.names()
	if err != nil {
		return nil, err
	}
	switch {
	case names["oci-layout"] && names["index.json"]:
		return a.ociImage(norm)
	case names["manifest.json"]:
		return a.dockerImage(norm)
	}
	return nil, errors.New("not an image archive: it has neither an OCI layout (oci-layout, index.json) nor a `docker save` manifest.json")
}

// dockerImage reads a `docker save` tarball with go-containerregistry.
func (a *imageArchive) dockerImage(norm string) (v1.Image, error) {
	var m tarball.Manifest
	if _, err := a.readJSON("manifest.json", &m); err != nil {
		return nil, err
	}
	var tag *name.Tag
	if len(m) > 1 {
		for _, d := range m {
			for _, rt := range d.RepoTags {
				if n, err := normaliseImageName(rt); err == nil && n == norm {
					t, err := name.NewTag(rt)
					if err != nil {
						return nil, err
					}
					tag = &t
				}
			}
		}
		if tag == nil {
			return nil, fmt.Errorf("the archive holds %d images and none is tagged %s", len(m), norm)
		}
	}
	return tarball.Image(a.reader, tag)
}

// OCI annotations that name an image in a layout's index.
const (
	annotationRefName        = "org.opencontainers.image.ref.name"
	annotationContainerdName = "io.containerd.image.name"
)

// ociImage reads an OCI image layout: index.json lists manifests or
// indexes (nested, as docker buildx writes them), and every blob is
// blobs/<algorithm>/<hex>.
func (a *imageArchive) ociImage(norm string) (v1.Image, error) {
	var idx v1.IndexManifest
	if _, err := a.readJSON("index.json", &idx); err != nil {
		return nil, err
	}
	images, err := a.ociManifests(idx.Manifests, nil, 0)
	if err != nil {
		return nil, err
	}
	var fit []v1.Descriptor
	for _, d := range images {
		if d.Platform == nil || (d.Platform.OS == pullPlatform.OS && d.Platform.Architecture == pullPlatform.Architecture) {
			fit = append(fit, d)
		}
	}
	if len(fit) > 1 {
		_, tag, _ := strings.Cut(norm[strings.LastIndex(norm, "/")+1:], ":")
		var named []v1.Descriptor
		for _, d := range fit {
			for _, k := range []string{annotationRefName, annotationContainerdName} {
				v := d.Annotations[k]
				if n, err := normaliseImageName(v); v != "" && (v == tag || err == nil && n == norm) {
					named = append(named, d)
					break
				}
			}
		}
		if len(named) != 1 {
			return nil, fmt.Errorf("the archive holds %d images for %s/%s and %d of them are named %s", len(fit), pullPlatform.OS, pullPlatform.Architecture, len(named), norm)
		}
		fit = named
	}
	if len(fit) == 0 {
		return nil, fmt.Errorf("the archive has no image for %s/%s (it has %d for other platforms)", pullPlatform.OS, pullPlatform.Architecture, len(images))
	}
	d := fit[0]
	var m v1.Manifest
	raw, err := a.readJSON(blobName(d.Digest), &m)
	if err != nil {
		return nil, err
	}
	mt := d.MediaType
	if m.MediaType != "" {
		mt = m.MediaType
	}
	return partial.CompressedToImage(&archiveImage{a: a, raw: raw, manifest: &m, mediaType: mt})
}

// ociManifests lists the image manifests among descs, looking into the
// indexes among them; an annotation naming an index names its images.
func (a *imageArchive) ociManifests(descs []v1.Descriptor, annotations map[string]string, depth int) ([]v1.Descriptor, error) {
	if depth > 4 {
		return nil, errors.New("indexes nested too deep")
	}
	var out []v1.Descriptor
	for _, d := range descs {
		if len(d.Annotations) == 0 && annotations != nil {
			d.Annotations = annotations
		}
		switch {
		case d.MediaType.IsIndex():
			var idx v1.IndexManifest
			if _, err := a.readJSON(blobName(d.Digest), &idx); err != nil {
				return nil, err
			}
			sub, err := a.ociManifests(idx.Manifests, d.Annotations, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		case d.MediaType.IsImage():
			out = append(out, d)
		}
	}
	return out, nil
}

func blobName(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// archiveImage is an image of an OCI layout archive, for
// partial.CompressedToImage, which derives the rest of v1.Image.
type archiveImage struct {
	a         *imageArchive
	raw       []byte
	manifest  *v1.Manifest
	mediaType types.MediaType
}

func (i *archiveImage) MediaType() (types.MediaType, error) { return i.mediaType, nil }

func (i *archiveImage) RawManifest() ([]byte, error) { return i.raw, nil }

func (i *archiveImage) RawConfigFile() ([]byte, error) {
	var cfg json.RawMessage
	return i.a.readJSON(blobName(i.manifest.Config.Digest), &cfg)
}

func (i *archiveImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, l := range i.manifest.Layers {
		if l.Digest == h {
			return &archiveLayer{a: i.a, desc: l}, nil
		}
	}
	return nil, fmt.Errorf("layer %s is not in the manifest", h)
}

// archiveLayer is a layer blob in an OCI layout archive.
type archiveLayer struct {
	a    *imageArchive
	desc v1.Descriptor
}

func (l *archiveLayer) Digest() (v1.Hash, error) { return l.desc.Digest, nil }

func (l *archiveLayer) Size() (int64, error) { return l.desc.Size, nil }

func (l *archiveLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }

func (l *archiveLayer) Compressed() (io.ReadCloser, error) { return l.a.open(blobName(l.desc.Digest)) }
