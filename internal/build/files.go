package build

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// Files for COPY steps are uploaded by the client before the build
// starts: it asks for a hash (FileStatus) and, if the file is not
// present, PUTs a tar or tar.gz archive to the URL it got. The URL is
// Warren's own, signed for one template and hash and valid for
// uploadValidity, so the upload needs no API key (the SDK sends none).
// Archives are kept per template under uploads/<templateID>/<hash>.

var hashPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

const (
	// MaxUpload bounds one archive.
	MaxUpload      = 8 << 30
	uploadValidity = time.Hour
	// UploadPathPrefix is where upload URLs point, below the API's root.
	UploadPathPrefix = "/upload/templates/"
)

func (b *Builder) uploadDir(templateID string) string {
	return filepath.Join(b.cfg.Images.Dir(), "uploads", templateID)
}

func (b *Builder) uploadPath(templateID, hash string) string {
	return filepath.Join(b.uploadDir(templateID), hash)
}

func (b *Builder) removeUploads(templateID string) error {
	return os.RemoveAll(b.uploadDir(templateID))
}

// FileStatus tells whether the archive of hash was uploaded for the
// team's template, and gives a signed URL (on apiURL, the API's base URL
// as the client reached it) to upload it to.
func (b *Builder) FileStatus(ctx context.Context, teamID, templateID, hash, apiURL string) (present bool, uploadURL string, err error) {
	if !hashPattern.MatchString(hash) {
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
// signature is right and not expired.
func (b *Builder) Upload(ctx context.Context, templateID, hash, expires, signature string, body io.Reader) error {
	if !hashPattern.MatchString(hash) || !namePattern.MatchString(templateID) {
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
	n, err := io.Copy(f, io.LimitReader(br, MaxUpload+1))
	if err != nil {
		return fmt.Errorf("receiving the upload: %w", err)
	}
	if n > MaxUpload {
		return fmt.Errorf("%w: the upload is larger than %d bytes", ErrInvalid, int64(MaxUpload))
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), b.uploadPath(templateID, hash))
}

// isArchive sniffs gzip's magic number or a tar header's "ustar".
func isArchive(head []byte) bool {
	if len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b {
		return true
	}
	return len(head) >= 262 && bytes.HasPrefix(head[257:], []byte("ustar"))
}

// isGzip tells whether the stored archive is gzip'd.
func isGzip(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var head [2]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return false, err
	}
	return head[0] == 0x1f && head[1] == 0x8b, nil
}
