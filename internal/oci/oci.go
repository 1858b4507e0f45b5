// Package oci gets container images onto this node: pulled from a
// registry (Pull, with go-containerregistry) or imported from a `docker
// save` or OCI layout archive (Import), their layers unpacked into the
// image store (internal/image) by internal/layertar, and recorded as
// templates with the defaults of the image's config.
//
// An image's layers are unpacked one directory each under layers/, named
// "oci-<hex of the layer's diffID>". The diffID is the digest of the
// uncompressed layer tar, so the name depends on the layer's content only:
// the same layer pulled from two registries, compressed with gzip or zstd,
// or imported from an archive is unpacked once and shared by every template
// that uses it, like the built-in layers. A team's pulls have layers of
// their own, "oci-<team tag>-<diffID>" (PullOptions.Team, see ociLayerID):
// a layer one team pulled with its credentials never answers another's. Because names are shared, a layer
// is trusted only after the uncompressed stream was hashed while unpacking
// and matched its diffID; otherwise an image could claim another image's
// diffID and plant its own files under that name.
//
// A layer is unpacked into layers/.tmp-oci-<random>/ and renamed into place
// when complete, as the built-in layers are: a layer dir that exists is
// whole, which is why an existing one is never fetched again. The temporary
// dir is flock'ed while it is being written, so that the image store's
// Cleanup removes only those that an interrupted run left behind.
//
// Layers are overlayfs lower dirs (internal/rootfs mounts them), so the
// OCI whiteouts in a layer tar become overlayfs ones (internal/layertar,
// which also says how a hostile tar is kept inside its layer). This needs
// root (mknod, trusted.* xattrs, chown).
//
// Which registries a pull may reach is registry.go's policy.
package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/warren-sandbox/warren/internal/image"
)

// PullOptions configures Pull.
type PullOptions struct {
	// Username and Password are sent to the registry with HTTP basic
	// authentication, or exchanged for a token where the registry asks for
	// one. Empty: anonymous.
	Username, Password string
	// Mirror ("host:port", or "http://host:port" for plain HTTP) is asked
	// instead of Docker Hub for images of docker.io, including short names
	// such as "debian:stable"; images of other registries are fetched from
	// those. A pull-through cache such as `registry:2` with a proxy
	// configuration is the usual mirror; on a machine without internet it
	// is the way to reach Docker Hub's images at all. Credentials, if any,
	// go to the mirror.
	Mirror string
	// AllowInsecure names registries ("HOST" or "HOST:PORT") that may be
	// reached over plain HTTP or at loopback, private, link-local or
	// other non-public addresses, which no other registry may (see
	// registry.go). The mirror is allowed too.
	AllowInsecure []string
	// Team scopes the layers: a team's pull reuses only layers that
	// team pulled before, never another team's (see ociLayerID). Empty:
	// the node's own, which imports and operators' pulls share.
	Team string
	// Progress, if set, gets one line per event: resolving the reference,
	// each layer being fetched and unpacked or already present, with
	// sizes. Lines have no trailing newline.
	Progress func(format string, args ...any)
}

// Timeouts of one connection to a registry. They are short so that a
// machine without internet fails in seconds, with advice (see pullError),
// rather than after the minutes of the defaults; a registry that answers
// at all answers well within them. They bound waiting for a connection and
// for a response's headers only: a large layer may take as long as it
// takes (ctx ends it).
const (
	registryDialTimeout   = 5 * time.Second
	registryTLSTimeout    = 5 * time.Second
	registryHeaderTimeout = 10 * time.Second
)

// pullPlatform is the platform taken from a multi-platform image: this
// machine's (linux/amd64 where Warren runs today), since sandboxes run the
// image's binaries natively.
var pullPlatform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// Pull fetches ref (for an index: its image for this machine, linux/amd64)
// and returns a template whose Layers are the image's layers, unpacked
// under layers/ as "oci-<hex of the layer's uncompressed diffID>" (with a
// team's tag before the diffID for opts.Team's). Layers are shared with
// every other image of the same scope (opts.Team) that has them, and one
// that is already there is not fetched again, so pulling an image a second time fetches
// only its manifest and config. Envs, Workdir and User come from the
// image's config (User "root" when it has none, as for Docker). ID is "":
// the caller names the template and stores it with PutTemplate.
//
// Registries are spoken to over HTTPS, at public addresses only, unless
// allowed by opts.AllowInsecure or as the mirror (registry.go): then
// plain HTTP is used where the registry speaks nothing else (loopback
// and private addresses, and mirrors given as http://host:port), and a
// refused registry's error (ErrRegistryNotAllowed) names the flag that
// allows it. An unreachable registry fails within seconds, with an error saying how
// to get the image without it (import an archive, or use a mirror);
// unknown images, tags and authentication failures have errors that say
// so.
func Pull(ctx context.Context, s *image.Store, ref string, opts PullOptions) (*image.Template, error) {
	progress := opts.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("oci: invalid image reference %q: %w", ref, err)
	}
	norm := familiarName(r)
	src, err := mirrored(r, opts.Mirror)
	if err != nil {
		return nil, err
	}
	registry := src.Context().RegistryStr()
	if registry != r.Context().RegistryStr() {
		progress("resolving %s (docker.io) via mirror %s", norm, registry)
	} else {
		progress("resolving %s", norm)
	}

	policy, err := newRegistryPolicy(opts.AllowInsecure, opts.Mirror)
	if err != nil {
		return nil, err
	}
	tr := policy.transport()
	defer tr.CloseIdleConnections()
	auth := authn.Anonymous
	if opts.Username != "" || opts.Password != "" {
		auth = authn.FromConfig(authn.AuthConfig{Username: opts.Username, Password: opts.Password})
	}
	fail := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("oci: pulling %s: %w", norm, ctx.Err())
		}
		return pullError(norm, registry, opts.Username, err)
	}
	desc, err := remote.Get(src,
		remote.WithContext(ctx),
		remote.WithAuth(auth),
		remote.WithTransport(tr),
		remote.WithPlatform(pullPlatform),
		remote.WithRetryPredicate(retryable),
		remote.WithUserAgent("warren"),
	)
	if err != nil {
		return nil, fail(err)
	}
	img, err := desc.Image()
	if err != nil {
		if desc.MediaType.IsIndex() {
			return nil, fmt.Errorf("oci: %s has no image for %s/%s: %w", norm, pullPlatform.OS, pullPlatform.Architecture, err)
		}
		return nil, fail(err)
	}
	dgst, err := img.Digest()
	if err != nil {
		return nil, fail(err)
	}
	progress("%s is %s", norm, dgst)
	t, err := unpackImage(ctx, s, img, opts.Team, progress, true)
	if err != nil {
		var le *layerError
		if errors.As(err, &le) {
			return nil, fmt.Errorf("oci: pulling %s: %w", norm, err)
		}
		return nil, fail(err)
	}
	progress("%s: %d layers ready", norm, len(t.Layers))
	return t, nil
}

// Import unpacks an image archive into layers, like Pull, and records the
// image as a template under name (e.g. "myimage:1.0"; a name without a tag
// gets ":latest"), replacing an earlier import of that name; ImportedImage
// finds it. The archive is either a `docker save` tarball or an OCI image
// layout in a tar (`skopeo copy ... oci-archive:FILE`, `docker buildx build
// --output type=oci,dest=FILE`), possibly gzip-compressed; which is
// sniffed from its contents. If it holds several images, the one for this
// machine's platform, or else the one tagged name, is taken. This is how a
// machine without internet gets images.
func Import(ctx context.Context, s *image.Store, name, archivePath string) (*image.Template, error) {
	norm, err := normaliseImageName(name)
	if err != nil {
		return nil, err
	}
	a, err := openArchive(archivePath)
	if err != nil {
		return nil, err
	}
	img, err := a.image(norm)
	if err != nil {
		return nil, fmt.Errorf("oci: importing %s from %s: %w", norm, archivePath, err)
	}
	t, err := unpackImage(ctx, s, img, "", nil, false)
	if err != nil {
		return nil, fmt.Errorf("oci: importing %s from %s: %w", norm, archivePath, err)
	}
	t.ID = importedTemplateID(norm)
	t.Recipe = norm
	if err := s.PutTemplate(t); err != nil {
		return nil, err
	}
	return t, nil
}

// ImportedImage returns the template that Import recorded for name
// (normalised the same way: "x" is "x:latest", "docker.io/library/x" is
// "x"), or an error wrapping ErrNotFound if there is none.
func ImportedImage(s *image.Store, name string) (*image.Template, error) {
	norm, err := normaliseImageName(name)
	if err != nil {
		return nil, err
	}
	t, err := s.Template(importedTemplateID(norm))
	if errors.Is(err, image.ErrNotFound) {
		return nil, fmt.Errorf("oci: no imported image %s: %w", norm, image.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if t.Recipe != norm {
		// Another name with the same truncated hash: never in practice,
		// but a wrong image would be worse than none.
		return nil, fmt.Errorf("oci: no imported image %s (its template holds %s): %w", norm, t.Recipe, image.ErrNotFound)
	}
	if _, err := s.LayerDirs(t); err != nil {
		return nil, fmt.Errorf("oci: imported image %s is incomplete, import it again: %w", norm, err)
	}
	return t, nil
}

// importedTemplateID is the template ID under which Import records the
// image of normalised name: names may hold characters ('/', ':', '@') that
// template IDs may not, so it is a hash of the name.
func importedTemplateID(norm string) string {
	sum := sha256.Sum256([]byte(norm))
	return "image-" + hex.EncodeToString(sum[:])[:24]
}

// normaliseImageName returns name as Docker shows it: with a tag
// (default "latest") or a digest, and without the implied "docker.io/" or
// "docker.io/library/", so that all the ways to spell one image are one
// name.
func normaliseImageName(n string) (string, error) {
	r, err := name.ParseReference(n)
	if err != nil {
		return "", fmt.Errorf("oci: invalid image name %q: %w", n, err)
	}
	return familiarName(r), nil
}

// familiarName is r in Docker's familiar form (see normaliseImageName).
func familiarName(r name.Reference) string {
	repo := r.Context().RepositoryStr()
	out := r.Context().RegistryStr() + "/" + repo
	if r.Context().RegistryStr() == name.DefaultRegistry {
		out = repo
		if rest, ok := strings.CutPrefix(repo, "library/"); ok && !strings.Contains(rest, "/") {
			out = rest
		}
	}
	switch r := r.(type) {
	case name.Digest:
		return out + "@" + r.DigestStr()
	case name.Tag:
		return out + ":" + r.TagStr()
	}
	return out + ":" + r.Identifier()
}

// mirrored returns r with the registry replaced by mirror if r is on
// Docker Hub and a mirror is set; otherwise r itself.
func mirrored(r name.Reference, mirror string) (name.Reference, error) {
	if mirror == "" || r.Context().RegistryStr() != name.DefaultRegistry {
		return r, nil
	}
	host := strings.TrimSuffix(mirror, "/")
	var opts []name.Option
	if h, ok := strings.CutPrefix(host, "http://"); ok {
		host = h
		opts = append(opts, name.Insecure)
	} else {
		host = strings.TrimPrefix(host, "https://")
	}
	if host == "" || strings.Contains(host, "/") {
		return nil, fmt.Errorf("oci: registry mirror %q must be host:port or http://host:port", mirror)
	}
	repo := host + "/" + r.Context().RepositoryStr()
	var (
		out name.Reference
		err error
	)
	if d, ok := r.(name.Digest); ok {
		out, err = name.NewDigest(repo+"@"+d.DigestStr(), opts...)
	} else {
		out, err = name.NewTag(repo+":"+r.Identifier(), opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("oci: registry mirror %q: %w", mirror, err)
	}
	return out, nil
}

// retryable tells go-containerregistry which failed requests to try again
// (up to three times in four seconds): flaky connections, as by default,
// but not a registry that cannot be reached at all, which retrying would
// only make the user wait longer for.
func retryable(err error) bool {
	if err == nil || unreachable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var t interface{ Temporary() bool }
	if errors.As(err, &t) && t.Temporary() {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// unreachable tells whether err means that no connection to the registry
// could be made or it did not answer in time: name resolution, connecting,
// a TLS handshake or response headers that timed out.
func unreachable(err error) bool {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return true
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// pullError turns an error from the registry into one that says what went
// wrong in the user's terms and, where there is one, what to do.
func pullError(image, registry, user string, err error) error {
	var refused *RegistryRefusedError
	if errors.As(err, &refused) {
		return fmt.Errorf("oci: pulling %s: %w", image, refused)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		if terr.Request != nil && terr.Request.URL.Path == "/v2/" && terr.StatusCode != http.StatusUnauthorized {
			return fmt.Errorf("oci: %s does not look like a container registry (GET /v2/ failed): %w", registry, err)
		}
		switch terr.StatusCode {
		case http.StatusUnauthorized:
			if user == "" {
				return fmt.Errorf("oci: registry %s refused anonymous access to %s: authentication required (the image may be private, or may not exist); give a username and password: %w", registry, image, err)
			}
			return fmt.Errorf("oci: authentication to registry %s as %q failed (wrong username or password?): %w", registry, user, err)
		case http.StatusForbidden:
			who := "anonymously"
			if user != "" {
				who = fmt.Sprintf("authenticated as %q", user)
			}
			return fmt.Errorf("oci: registry %s denied access to %s (%s): %w", registry, image, who, err)
		case http.StatusNotFound:
			for _, d := range terr.Errors {
				if d.Code == transport.NameUnknownErrorCode {
					return fmt.Errorf("oci: %s not found: registry %s has no such repository: %w", image, registry, err)
				}
			}
			return fmt.Errorf("oci: %s not found on registry %s (unknown tag or digest): %w", image, registry, err)
		case http.StatusTooManyRequests:
			return fmt.Errorf("oci: registry %s is rate-limiting this machine (for Docker Hub: log in, or use a registry mirror): %w", registry, err)
		}
	}
	if unreachable(err) {
		return fmt.Errorf("oci: cannot reach registry %s: %w; this machine may be offline: import the image with `warren image import %s ARCHIVE`, or start warren with --registry-mirror", registry, err, image)
	}
	return fmt.Errorf("oci: pulling %s from %s: %w", image, registry, err)
}
