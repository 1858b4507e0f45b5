package image

// Importing OCI and Docker images.
//
// An image's layers are unpacked one directory each under layers/, named
// "oci-<hex of the layer's diffID>". The diffID is the digest of the
// uncompressed layer tar, so the name depends on the layer's content only:
// the same layer pulled from two registries, compressed with gzip or zstd,
// or imported from an archive is unpacked once and shared by every template
// that uses it, like the built-in layers. Because names are shared, a layer
// is trusted only after the uncompressed stream was hashed while unpacking
// and matched its diffID; otherwise an image could claim another image's
// diffID and plant its own files under that name.
//
// A layer is unpacked into layers/.tmp-oci-<random>/ and renamed into place
// when complete, as the built-in layers are: a layer dir that exists is
// whole, which is why an existing one is never fetched again. The temporary
// dir is flock'ed while it is being written, so that Cleanup removes only
// those that an interrupted run left behind.
//
// Layers are overlayfs lower dirs (see Mount), so the OCI whiteouts in a
// layer tar become overlayfs ones: ".wh.NAME" becomes a character device
// 0:0 called NAME, and ".wh..wh..opq" marks its directory opaque with the
// xattr trusted.overlay.opaque=y. This is what containerd's and Docker's
// overlay snapshotters do, and it needs root (mknod, trusted.* xattrs,
// chown), as everything else in this package does.
//
// A layer tar is untrusted input. Device nodes are left out (a sandbox's
// /dev is a tmpfs of the runtime's, and a block device in a layer under
// the data dir would give the host's disk to whoever can open it); a
// character device 0:0 is kept, as it is an overlayfs whiteout. Setuid
// and setgid bits are kept (sudo needs them): the data dir is 0700, so no
// other local user can run what a layer holds. Entry names that are
// absolute or climb out with ".." are refused, and nothing is ever written through a
// symbolic link: every parent directory of an entry is checked, with
// lstat, to be a real directory inside the layer before the entry is
// created, so a tar holding "a -> /etc" and then "a/passwd" fails instead
// of writing the host's /etc/passwd. The checks cannot be raced: the
// layer's root stays mode 0700 until the end, so no other user can reach
// into the tree meanwhile (a world-writable directory such as tmp/ inside
// it would otherwise let anyone swap a directory for a symlink between the
// check and the write). Hard links must point inside the same layer, and
// only the security.capability xattr is taken from the tar: others, such
// as trusted.overlay.*, could change how overlayfs reads the layer.

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
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
// under layers/ as "oci-<hex of the layer's uncompressed diffID>". Layers
// are shared with every other image that has them, and one that is already
// there is not fetched again, so pulling an image a second time fetches
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
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (*Template, error) {
	progress := opts.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image: invalid image reference %q: %w", ref, err)
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
			return fmt.Errorf("image: pulling %s: %w", norm, ctx.Err())
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
			return nil, fmt.Errorf("image: %s has no image for %s/%s: %w", norm, pullPlatform.OS, pullPlatform.Architecture, err)
		}
		return nil, fail(err)
	}
	dgst, err := img.Digest()
	if err != nil {
		return nil, fail(err)
	}
	progress("%s is %s", norm, dgst)
	t, err := s.unpackImage(ctx, img, progress, true)
	if err != nil {
		var le *layerError
		if errors.As(err, &le) {
			return nil, fmt.Errorf("image: pulling %s: %w", norm, err)
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
func (s *Store) Import(ctx context.Context, name, archivePath string) (*Template, error) {
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
		return nil, fmt.Errorf("image: importing %s from %s: %w", norm, archivePath, err)
	}
	t, err := s.unpackImage(ctx, img, nil, false)
	if err != nil {
		return nil, fmt.Errorf("image: importing %s from %s: %w", norm, archivePath, err)
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
func (s *Store) ImportedImage(name string) (*Template, error) {
	norm, err := normaliseImageName(name)
	if err != nil {
		return nil, err
	}
	t, err := s.Template(importedTemplateID(norm))
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("image: no imported image %s: %w", norm, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if t.Recipe != norm {
		// Another name with the same truncated hash: never in practice,
		// but a wrong image would be worse than none.
		return nil, fmt.Errorf("image: no imported image %s (its template holds %s): %w", norm, t.Recipe, ErrNotFound)
	}
	if _, err := s.LayerDirs(t); err != nil {
		return nil, fmt.Errorf("image: imported image %s is incomplete, import it again: %w", norm, err)
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
		return "", fmt.Errorf("image: invalid image name %q: %w", n, err)
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
		return nil, fmt.Errorf("image: registry mirror %q must be host:port or http://host:port", mirror)
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
		return nil, fmt.Errorf("image: registry mirror %q: %w", mirror, err)
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
		return fmt.Errorf("image: pulling %s: %w", image, refused)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		if terr.Request != nil && terr.Request.URL.Path == "/v2/" && terr.StatusCode != http.StatusUnauthorized {
			return fmt.Errorf("image: %s does not look like a container registry (GET /v2/ failed): %w", registry, err)
		}
		switch terr.StatusCode {
		case http.StatusUnauthorized:
			if user == "" {
				return fmt.Errorf("image: registry %s refused anonymous access to %s: authentication required (the image may be private, or may not exist); give a username and password: %w", registry, image, err)
			}
			return fmt.Errorf("image: authentication to registry %s as %q failed (wrong username or password?): %w", registry, user, err)
		case http.StatusForbidden:
			who := "anonymously"
			if user != "" {
				who = fmt.Sprintf("authenticated as %q", user)
			}
			return fmt.Errorf("image: registry %s denied access to %s (%s): %w", registry, image, who, err)
		case http.StatusNotFound:
			for _, d := range terr.Errors {
				if d.Code == transport.NameUnknownErrorCode {
					return fmt.Errorf("image: %s not found: registry %s has no such repository: %w", image, registry, err)
				}
			}
			return fmt.Errorf("image: %s not found on registry %s (unknown tag or digest): %w", image, registry, err)
		case http.StatusTooManyRequests:
			return fmt.Errorf("image: registry %s is rate-limiting this machine (for Docker Hub: log in, or use a registry mirror): %w", registry, err)
		}
	}
	if unreachable(err) {
		return fmt.Errorf("image: cannot reach registry %s: %w; this machine may be offline: import the image with `warren image import %s ARCHIVE`, or start warren with --registry-mirror", registry, err, image)
	}
	return fmt.Errorf("image: pulling %s from %s: %w", image, registry, err)
}

// layerError is a failure to unpack a layer's contents, as opposed to a
// failure to fetch them.
type layerError struct {
	id  string
	err error
}

func (e *layerError) Error() string { return "layer " + e.id + ": " + e.err.Error() }
func (e *layerError) Unwrap() error { return e.err }

// unpackImage unpacks img's layers that are not there yet and returns a
// template (without ID) of them and img's config. progress may be nil;
// sizes says whether img's layers know their (compressed) size cheaply.
func (s *Store) unpackImage(ctx context.Context, img v1.Image, progress func(string, ...any), sizes bool) (*Template, error) {
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
		id, err := s.unpackLayer(ctx, diffIDs[i], l.Uncompressed, step)
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
func templateFromConfig(cfg *v1.ConfigFile) *Template {
	t := &Template{User: cfg.Config.User, Workdir: cfg.Config.WorkingDir}
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

// ociTempPrefix starts the names of the temporary dirs layers are
// unpacked into (in layers/).
const ociTempPrefix = ".tmp-oci-"

var hexDigest = regexp.MustCompile(`^[a-f0-9]{64}$`)

// ociLayerID is the ID of the layer whose uncompressed tar has diffID.
func ociLayerID(diffID v1.Hash) (string, error) {
	// The diffID comes from the image and becomes a path: check it.
	if diffID.Algorithm != "sha256" || !hexDigest.MatchString(diffID.Hex) {
		return "", fmt.Errorf("unsupported layer diffID %q", diffID)
	}
	return "oci-" + diffID.Hex, nil
}

// unpackLayer makes sure that the layer whose uncompressed tar has diffID
// is unpacked under layers/ and returns its ID. open, which returns the
// uncompressed tar, is called only if it is not there yet. The stream is
// hashed as it is unpacked and must match diffID. step, if not nil, gets
// progress lines.
func (s *Store) unpackLayer(ctx context.Context, diffID v1.Hash, open func() (io.ReadCloser, error), step func(string, ...any)) (_ string, err error) {
	if step == nil {
		step = func(string, ...any) {}
	}
	id, err := ociLayerID(diffID)
	if err != nil {
		return "", err
	}
	final := s.LayerDir(id)
	if _, err := os.Lstat(final); err == nil {
		step("already present")
		return id, nil
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(filepath.Join(s.dir, "layers"), ociTempPrefix)
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	// Held until the layer is renamed into place or removed: Cleanup
	// leaves a locked temporary dir alone.
	lock, err := unix.Open(tmp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(lock)
	if err := unix.Flock(lock, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return "", fmt.Errorf("locking %s: %w", tmp, err)
	}

	step("fetching")
	rc, err := open()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	h := sha256.New()
	in := &countingReader{r: io.TeeReader(ctxReader{ctx, rc}, h)}
	w := &layerWriter{root: tmp, buf: make([]byte, 256<<10)}
	tr := tar.NewReader(guardedReader{in, s.spaceGuard})
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err // a read error of the stream, a corrupt tar, or the space guard
		}
		if err := w.entry(hdr, tr); err != nil {
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
	if err := w.finish(); err != nil {
		return "", &layerError{id: id, err: err}
	}
	if n := len(w.droppedDevices); n > 0 {
		step("left out %d device node(s) (a sandbox's /dev is its own), e.g. /%s", n, w.droppedDevices[0])
	}
	// The rename below commits the layer, so its files must be on disk
	// first: after a crash, a layer dir that exists must be whole.
	if err := unix.Syncfs(lock); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Lstat(final); serr != nil {
			return "", err
		}
		// Another pull unpacked the same layer meanwhile: use its.
		_ = os.RemoveAll(tmp)
	}
	step("unpacked %s in %.1fs", humanSize(in.n), time.Since(start).Seconds())
	return id, nil
}

// removeStaleTemps removes layers/.tmp-oci-* and layers/.tmp-commit-*
// dirs that no unpack or commit holds locked: ones a crash or kill left
// behind. A dir younger than a minute is spared too, as its unpack may not
// have taken the lock yet.
func (s *Store) removeStaleTemps() error {
	var tmps []string
	for _, prefix := range []string{ociTempPrefix, commitTempPrefix} {
		m, _ := filepath.Glob(filepath.Join(s.dir, "layers", prefix+"*"))
		tmps = append(tmps, m...)
	}
	var errs []error
	for _, t := range tmps {
		fi, err := os.Lstat(t)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < time.Minute {
			continue
		}
		fd, err := unix.Open(t, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			errs = append(errs, os.RemoveAll(t))
		}
		unix.Close(fd)
	}
	return errors.Join(errs...)
}

// Overlayfs' names for OCI whiteouts (see the comment at the top).
const (
	whiteoutPrefix   = ".wh."
	whiteoutMeta     = ".wh..wh."     // AUFS bookkeeping, not a whiteout
	whiteoutOpaque   = ".wh..wh..opq" // the directory hides lower layers' contents
	opaqueXattr      = "trusted.overlay.opaque"
	capabilityXattr  = "security.capability"
	capabilityPAXKey = "SCHILY.xattr." + capabilityXattr
)

// layerWriter writes a layer tar's entries into root, a new private
// directory. Every write goes to a path whose parents were checked (by
// dir) to be real directories inside root.
type layerWriter struct {
	root string
	buf  []byte
	// checked is a directory (relative to root) known to be a real
	// directory chain: entries usually come directory by directory, so
	// this saves most of the lstats. Anything removed resets it.
	checked string
	// dirs are directories whose times are set at the end, once nothing
	// more is created in them.
	dirs    []*tar.Header
	rootHdr *tar.Header
	// droppedDevices are the device nodes left out, by name.
	droppedDevices []string
}

// entry writes one entry of the tar; r is its content.
func (w *layerWriter) entry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // archive-wide PAX records, already applied by archive/tar
	}
	rel, err := entryPath(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("the layer's root must be a directory")
		}
		h := *hdr
		w.rootHdr = &h
		return nil
	}
	parent, base := path.Split(rel)
	parent = strings.TrimSuffix(parent, "/")
	if err := w.dir(parent, true); err != nil {
		return err
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		return w.whiteout(hdr, parent, base)
	}
	p := filepath.Join(w.root, rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		// A directory that replaces this layer's whiteout of the same
		// name was deleted and made anew: it must hide what lower
		// layers had in it, and overlayfs cannot express both a
		// whiteout and a directory, but an opaque directory does that.
		replacesWhiteout := isWhiteout(p)
		kept, err := w.clear(p, true)
		if err != nil {
			return err
		}
		if !kept {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
		}
		if replacesWhiteout {
			if err := unix.Lsetxattr(p, opaqueXattr, []byte("y"), 0); err != nil {
				return err
			}
		}
		if err := w.owner(p, hdr); err != nil {
			return err
		}
		h := *hdr
		w.dirs = append(w.dirs, &h)
		return unix.Chmod(p, uint32(hdr.Mode&0o7777))
	case tar.TypeReg, tar.TypeRegA:
		if isSparse(hdr) {
			return errors.New("sparse file entries are not supported")
		}
		if _, err := w.clear(p, false); err != nil {
			return err
		}
		return w.file(p, hdr, r)
	case tar.TypeSymlink:
		if _, err := w.clear(p, false); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
		if err := w.owner(p, hdr); err != nil {
			return err
		}
		return setTimes(p, hdr)
	case tar.TypeLink:
		return w.hardlink(p, parent, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if _, err := w.clear(p, false); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeFifo && !(hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0) {
			// A device node: left out (see the comment at the top).
			w.droppedDevices = append(w.droppedDevices, rel)
			return nil
		}
		mode := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		if err := unix.Mknod(p, mode|0o600, 0); err != nil {
			return err
		}
		if err := w.owner(p, hdr); err != nil {
			return err
		}
		// mknod's mode is masked by the umask; chmod is not.
		if err := unix.Chmod(p, uint32(hdr.Mode&0o7777)); err != nil {
			return err
		}
		return setTimes(p, hdr)
	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
}

// isSparse tells whether hdr is a regular file in one of GNU tar's sparse
// formats (PAX 0.x and 1.0; the old GNU format has its own type, which
// entry refuses as unknown). archive/tar reads a sparse file's holes back
// as zeros, and a header of a few bytes can declare any size: a tiny layer
// would write terabytes. Container tools do not write them.
func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// entryPath is an entry's name relative to the layer's root, "." for the
// root itself. Absolute names and names that climb out with ".." are
// refused: a layer has no business there.
func entryPath(n string) (string, error) {
	if n == "" {
		return "", errors.New("empty entry name")
	}
	if strings.HasPrefix(n, "/") {
		return "", errors.New("absolute entry name")
	}
	c := path.Clean(n)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", errors.New("entry name escapes the layer")
	}
	return c, nil
}

// dir makes sure rel ("" or "." for the root) is a real directory inside
// root: no component may be a symbolic link or anything but a directory.
// Missing components are created (mode 0755, like Docker does for a tar
// that lists a file before its directory) if create is set, else an error.
func (w *layerWriter) dir(rel string, create bool) error {
	if rel == "" || rel == "." || rel == w.checked {
		return nil
	}
	cur := w.root
	for _, c := range strings.Split(rel, "/") {
		cur = filepath.Join(cur, c)
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := os.Mkdir(cur, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%s is a symbolic link: refusing to write through it", strings.TrimPrefix(cur, w.root+"/"))
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory", strings.TrimPrefix(cur, w.root+"/"))
		}
	}
	w.checked = rel
	return nil
}

// clear makes way for a new entry at p, whose parent is checked: an
// earlier entry of the same name is removed, unless both are directories,
// which merge (kept is then true), as when tar extracts over a tree.
func (w *layerWriter) clear(p string, dir bool) (kept bool, _ error) {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if dir && fi.IsDir() {
		return true, nil
	}
	w.checked = "" // p may have been part of it
	return false, os.RemoveAll(p)
}

// file writes a regular file. Ownership is set before the mode, since
// chown clears setuid and setgid bits, and before the capability xattr,
// which chown clears too.
func (w *layerWriter) file(p string, hdr *tar.Header, r io.Reader) error {
	// O_EXCL: p was cleared, so this creates the file and never opens
	// something that appeared meanwhile, nor follows a symlink.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyBuffer(f, r, w.buf); err != nil {
		return err
	}
	fd := int(f.Fd())
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return err
	}
	if v, ok := hdr.PAXRecords[capabilityPAXKey]; ok {
		if err := unix.Fsetxattr(fd, capabilityXattr, []byte(v), 0); err != nil {
			return fmt.Errorf("setting %s: %w", capabilityXattr, err)
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return setTimes(p, hdr)
}

// hardlink links p to an earlier entry of the same layer.
func (w *layerWriter) hardlink(p, parent string, hdr *tar.Header) error {
	target, err := entryPath(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if target == "." {
		return errors.New("hard link to the layer's root")
	}
	if slices.Contains(w.droppedDevices, target) {
		w.droppedDevices = append(w.droppedDevices, strings.TrimPrefix(p, w.root+"/"))
		return nil // a link to a device node that was left out
	}
	tp := filepath.Join(w.root, target)
	if tp == p {
		return errors.New("hard link to itself")
	}
	// The target's own parents must be real directories too, or the link
	// could reach a file outside the layer through a symlink.
	if err := w.dir(path.Dir(target), false); err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	fi, err := os.Lstat(tp)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("hard link target %q is a directory", hdr.Linkname)
	}
	// Checking the target's parents may have moved w.checked; check p's
	// again (cheap when it was the same directory).
	if err := w.dir(parent, true); err != nil {
		return err
	}
	if _, err := w.clear(p, false); err != nil {
		return err
	}
	// link(2) does not follow a symlink at tp: it links the symlink.
	return os.Link(tp, p)
}

// whiteout turns an OCI whiteout entry into overlayfs' form. A whiteout
// hides lower layers' files only, never its own layer's (OCI image spec,
// "Whiteouts"): if this layer already has the name, a directory is made
// opaque instead and anything else left as it is, since it hides lower
// layers' file already.
func (w *layerWriter) whiteout(hdr *tar.Header, parent, base string) error {
	if base == whiteoutOpaque {
		return unix.Lsetxattr(filepath.Join(w.root, parent), opaqueXattr, []byte("y"), 0)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	hidden := strings.TrimPrefix(base, whiteoutPrefix)
	if hidden == "" || hidden == "." || hidden == ".." {
		return fmt.Errorf("invalid whiteout %q", base)
	}
	p := filepath.Join(w.root, parent, hidden)
	fi, err := os.Lstat(p)
	switch {
	case err == nil && fi.IsDir():
		return unix.Lsetxattr(p, opaqueXattr, []byte("y"), 0)
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := unix.Mknod(p, unix.S_IFCHR, int(unix.Mkdev(0, 0))); err != nil {
		return fmt.Errorf("making whiteout %s: %w", hidden, err)
	}
	return w.owner(p, hdr)
}

// isWhiteout tells whether p is an overlayfs whiteout: a character
// device 0:0.
func isWhiteout(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// owner sets p's owner (p's own, not a symlink's target).
func (w *layerWriter) owner(p string, hdr *tar.Header) error {
	return unix.Lchown(p, hdr.Uid, hdr.Gid)
}

// finish sets directories' times, now that nothing more is created in
// them, and then the root's attributes, which opens it to other users.
func (w *layerWriter) finish() error {
	for _, hdr := range w.dirs {
		rel, _ := entryPath(hdr.Name)
		// A later entry may have replaced the directory, or one of its
		// parents, with something else: check again.
		if err := w.dir(path.Dir(rel), false); err != nil {
			continue
		}
		p := filepath.Join(w.root, rel)
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			continue
		}
		if err := setTimes(p, hdr); err != nil {
			return err
		}
	}
	root := w.rootHdr
	if root == nil {
		now := time.Now()
		root = &tar.Header{Mode: 0o755, ModTime: now, AccessTime: now}
	}
	if err := w.owner(w.root, root); err != nil {
		return err
	}
	if err := unix.Chmod(w.root, uint32(root.Mode&0o7777)); err != nil {
		return err
	}
	return setTimes(w.root, root)
}

// setTimes sets p's access and modification times from hdr, on p itself
// if it is a symlink.
func setTimes(p string, hdr *tar.Header) error {
	mtime := hdr.ModTime
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{
		{Sec: atime.Unix(), Nsec: int64(atime.Nanosecond())},
		{Sec: mtime.Unix(), Nsec: int64(mtime.Nanosecond())},
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
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

// Image archives.

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
		return nil, fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	magic := make([]byte, 2)
	if _, err := io.ReadFull(f, magic); err != nil {
		return nil, fmt.Errorf("image: %s is not an image archive: %w", p, err)
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
func (i *archiveImage) RawManifest() ([]byte, error)        { return i.raw, nil }

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

func (l *archiveLayer) Digest() (v1.Hash, error)            { return l.desc.Digest, nil }
func (l *archiveLayer) Size() (int64, error)                { return l.desc.Size, nil }
func (l *archiveLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }
func (l *archiveLayer) Compressed() (io.ReadCloser, error)  { return l.a.open(blobName(l.desc.Digest)) }
