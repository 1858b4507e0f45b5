package template

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/store"
)

// Files for COPY steps are uploaded by the client before the build
// starts: it asks for a hash (FileStatus) and, if the file is not
// present, PUTs a tar or tar.gz archive to the URL it got. The URL is
// Warren's own, signed for one template and hash and valid for
// uploadValidity, so the upload needs no API key (the SDK sends none).
// The signing key is kept in the data dir (uploadKeyFile), so that a URL
// handed out before a restart still works after it.
// Archives are kept per template under uploads/<templateID>/<hash>.
//
// Uploads are bounded: one archive by Config.MaxUploadBytes, counted
// while it streams (ErrTooLarge, and nothing is kept), and what one
// template keeps by MaxTemplateUploads and MaxTemplateUploadBytes. Once
// a build is ready, the archives that no build of the template still
// needs are removed (pruneUploads), so a template keeps about the files
// of its latest build and its bounds do not fill up over edits.
//
// The hash is the client's name for the archive, not a digest Warren
// can check: the layer cache is keyed by the archive's content instead
// (see the COPY step in run.go).

const (
	defaultMaxUpload          = 1 << 30
	defaultMaxTemplateUploads = 256
	uploadValidity            = time.Hour
	// UploadPathPrefix is where upload URLs point, below the API's root.
	UploadPathPrefix = "/upload/templates/"
	// uploadKeyFile, in the data dir, holds the key upload URLs are
	// signed with.
	uploadKeyFile = "upload.key"
	uploadKeySize = 32
)

// loadUploadKey returns the key upload URLs are signed with, creating it
// in dataDir (mode 0600) the first time. It is written under a temporary
// name and linked into place, so that a crash never leaves half a key
// and two starts racing end up with the same one.
func loadUploadKey(dataDir string) ([]byte, error) {
	p := filepath.Join(dataDir, uploadKeyFile)
	key, err := readUploadKey(p)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	key = make([]byte, uploadKeySize)
	rand.Read(key)
	f, err := os.CreateTemp(dataDir, ".upload-key-*") // mode 0600
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(key)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("template: writing the upload signing key: %w", err)
	}
	if err := os.Link(f.Name(), p); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("template: keeping the upload signing key: %w", err)
	}
	return readUploadKey(p)
}

func readUploadKey(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("template: the upload signing key %s is not a regular file", p)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := f.Chmod(0o600); err != nil {
			return nil, fmt.Errorf("template: the upload signing key %s is readable by others and cannot be made private: %w", p, err)
		}
	}
	key := make([]byte, uploadKeySize+1)
	n, err := io.ReadFull(f, key)
	if n != uploadKeySize || !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("template: the upload signing key %s is damaged (%d bytes, want %d): remove it, and a new one is made (upload URLs handed out so far stop working)", p, n, uploadKeySize)
	}
	return key[:n], nil
}

func (b *Builder) uploadDir(templateID string) string {
	return filepath.Join(b.cfg.Images.Dir(), "uploads", templateID)
}

func (b *Builder) uploadPath(templateID, hash string) string {
	return filepath.Join(b.uploadDir(templateID), hash)
}

func (b *Builder) removeUploads(templateID string) error {
	return os.RemoveAll(b.uploadDir(templateID))
}

// removeStaleUploads removes the partial uploads a previous run left
// (none is in progress before the API serves).
func (b *Builder) removeStaleUploads() {
	tmps, _ := filepath.Glob(filepath.Join(b.cfg.Images.Dir(), "uploads", "*", ".tmp-*"))
	for _, p := range tmps {
		if err := os.Remove(p); err != nil {
			b.log.Warn("removing a partial upload", "path", p, "err", err)
		}
	}
}

// FileStatus tells whether the archive of hash was uploaded for the
// team's template, and gives a signed URL (on apiURL, the API's base URL
// as the client reached it) to upload it to.
func (b *Builder) FileStatus(ctx context.Context, teamID, templateID, hash, apiURL string) (present bool, uploadURL string, err error) {
	if !buildspec.ValidFilesHash(hash) {
		return false, "", fmt.Errorf("%w: invalid files hash %q", ErrInvalid, hash)
	}
	t, _, err := b.owned(ctx, teamID, templateID)
	if err != nil {
		return false, "", err
	}
	_, err = os.Stat(b.uploadPath(t.ID, hash))
	present = err == nil
	expires := strconv.FormatInt(time.Now().Add(uploadValidity).Unix(), 10)
	q := url.Values{"expires": {expires}, "signature": {b.sign("upload", t.ID, hash, expires)}}
	return present, apiURL + UploadPathPrefix + t.ID + "/files/" + hash + "?" + q.Encode(), nil
}

// Upload stores the archive body for hash of template templateID, if the
// signature is right and not expired. An archive larger than
// MaxUploadBytes is refused once that much was read (ErrTooLarge), and
// nothing of it is kept.
func (b *Builder) Upload(ctx context.Context, templateID, hash, expires, signature string, body io.Reader) error {
	if !buildspec.ValidFilesHash(hash) || !namePattern.MatchString(templateID) {
		return fmt.Errorf("%w: invalid upload path", ErrInvalid)
	}
	if !hmac.Equal([]byte(signature), []byte(b.sign("upload", templateID, hash, expires))) {
		return fmt.Errorf("%w: the upload URL's signature is not valid", ErrForbidden)
	}
	if exp, err := strconv.ParseInt(expires, 10, 64); err != nil || time.Now().Unix() > exp {
		return fmt.Errorf("%w: the upload URL has expired; ask for a new one", ErrForbidden)
	}
	if _, err := b.cfg.Store.GetTemplate(ctx, templateID); err != nil {
		return fmt.Errorf("%w: template %s", ErrNotFound, templateID)
	}
	if err := os.MkdirAll(b.uploadDir(templateID), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(b.uploadDir(templateID), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	defer f.Close()
	br := bufio.NewReaderSize(body, 1024)
	head, _ := br.Peek(512)
	if !isArchive(head) {
		return fmt.Errorf("%w: the upload is neither a tar nor a gzip'd tar archive", ErrInvalid)
	}
	limit := b.cfg.MaxUploadBytes
	n, err := io.Copy(f, io.LimitReader(br, limit+1))
	if err != nil {
		return fmt.Errorf("receiving the upload: %w", err)
	}
	if n > limit {
		return fmt.Errorf("%w: the upload is larger than %d bytes, this server's limit (warren serve --max-upload-mb)", ErrTooLarge, limit)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return b.keepUpload(templateID, hash, f.Name(), n)
}

// keepUpload renames a received archive into place if the template's
// archives stay within their bounds with it.
func (b *Builder) keepUpload(templateID, hash, tmp string, size int64) error {
	b.uploadMu.Lock()
	defer b.uploadMu.Unlock()
	ents, err := os.ReadDir(b.uploadDir(templateID))
	if err != nil {
		return err
	}
	count, total := 1, size
	for _, e := range ents {
		if e.Name() == hash || !buildspec.ValidFilesHash(e.Name()) {
			continue // replaced, or a temporary file
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		count++
		total += fi.Size()
	}
	const advice = "archives no build needs any more are removed when a build of the template is ready"
	if count > b.cfg.MaxTemplateUploads {
		return fmt.Errorf("%w: template %s would keep %d uploaded archives, more than this server's limit of %d (%s)", ErrTooLarge, templateID, count, b.cfg.MaxTemplateUploads, advice)
	}
	if total > b.cfg.MaxTemplateUploadBytes {
		return fmt.Errorf("%w: template %s would keep %d bytes of uploaded archives, more than this server's limit of %d (%s)", ErrTooLarge, templateID, total, b.cfg.MaxTemplateUploadBytes, advice)
	}
	return os.Rename(tmp, b.uploadPath(templateID, hash))
}

// pruneUploads removes, once a build of the template is ready with spec,
// the template's archives that neither it nor a started, unfinished build
// uses, except those uploaded since a build that is not started yet was
// made (they may be that build's files). A client that was told an
// archive is present before a build of the same template removed it
// meanwhile gets "upload them first" when it starts its build.
func (b *Builder) pruneUploads(ctx context.Context, templateID string, spec buildspec.Spec) {
	keep := map[string]bool{}
	uses := func(s buildspec.Spec) {
		for _, st := range s.Steps {
			if st.FilesHash != "" {
				keep[st.FilesHash] = true
			}
		}
	}
	uses(spec)
	builds, err := b.cfg.Store.ListBuilds(ctx, templateID)
	if err != nil {
		b.log.Warn("listing builds to prune uploads", "template", templateID, "err", err)
		return
	}
	var since time.Time // uploads from then on are kept; zero: none
	for _, bd := range builds {
		if bd.Status != store.BuildWaiting && bd.Status != store.BuildBuilding {
			continue
		}
		if rec := readRecord(bd); rec.Spec != nil {
			uses(*rec.Spec)
		} else if since.IsZero() || bd.CreatedAt.Before(since) {
			since = bd.CreatedAt
		}
	}
	b.uploadMu.Lock()
	defer b.uploadMu.Unlock()
	ents, err := os.ReadDir(b.uploadDir(templateID))
	if err != nil {
		return
	}
	for _, e := range ents {
		if !buildspec.ValidFilesHash(e.Name()) || keep[e.Name()] {
			continue
		}
		if fi, err := e.Info(); err != nil || (!since.IsZero() && !fi.ModTime().Before(since)) {
			continue
		}
		if err := os.Remove(b.uploadPath(templateID, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("removing an unused upload", "template", templateID, "hash", e.Name(), "err", err)
		}
	}
}

// isArchive sniffs gzip's magic number or a tar header's "ustar".
func isArchive(head []byte) bool {
	if len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b {
		return true
	}
	return len(head) >= 262 && bytes.HasPrefix(head[257:], []byte("ustar"))
}
