package files

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/envd/users"
)

// metadataXattrPrefix namespaces user metadata in extended attributes.
const metadataXattrPrefix = "user.e2b."

// Metadata limits: printable ASCII, keys up to 246 bytes (255 minus the
// xattr prefix), 4 KiB for all keys and values together.
const (
	maxMetadataKey   = 246
	maxMetadataTotal = 4096
)

// statusError carries the HTTP status an upload failure maps to.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

func failf(status int, format string, args ...any) error {
	return &statusError{status, fmt.Sprintf(format, args...)}
}

func writeFailure(w http.ResponseWriter, err error) {
	var se *statusError
	if errors.As(err, &se) {
		writeError(w, se.status, se.msg)
		return
	}
	writeError(w, http.StatusInternalServerError, err.Error())
}

// upload serves POST /files: a multipart form with one part named "file"
// per file (the part's filename is its destination), or one raw file
// (application/octet-stream, optionally gzip-encoded) at ?path=.
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	u, ok := h.authorize(w, r, "write")
	if !ok {
		return
	}
	meta, err := parseMetadata(r.Header)
	if err != nil {
		writeFailure(w, err)
		return
	}
	queryPath := r.URL.Query().Get("path")
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid Content-Type: "+err.Error())
		return
	}
	var written []entry
	switch mediaType {
	case "multipart/form-data":
		written, err = h.uploadMultipart(r, params["boundary"], u, queryPath, meta)
	case "application/octet-stream":
		written, err = h.uploadRaw(r, u, queryPath, meta)
	default:
		err = failf(http.StatusBadRequest, "unsupported Content-Type %q: use multipart/form-data or application/octet-stream", mediaType)
	}
	if err != nil {
		writeFailure(w, err)
		return
	}
	writeJSON(w, written)
}

func (h *Handler) uploadRaw(r *http.Request, u *users.User, queryPath string, meta map[string]string) ([]entry, error) {
	if queryPath == "" {
		return nil, failf(http.StatusBadRequest, "the path query parameter is required for application/octet-stream uploads")
	}
	var body io.Reader = r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, failf(http.StatusBadRequest, "invalid gzip body: %v", err)
		}
		defer gz.Close()
		body = gz
	default:
		return nil, failf(http.StatusBadRequest, "unsupported Content-Encoding %q: only gzip is supported", enc)
	}
	dst := u.ResolvePath(queryPath, h.settings.DefaultWorkdir())
	if err := writeFile(u, dst, body, meta); err != nil {
		return nil, err
	}
	return []entry{{Path: dst, Name: filepath.Base(dst), Type: "file", Metadata: meta}}, nil
}

func (h *Handler) uploadMultipart(r *http.Request, boundary string, u *users.User, queryPath string, meta map[string]string) ([]entry, error) {
	if boundary == "" {
		return nil, failf(http.StatusBadRequest, "multipart Content-Type has no boundary")
	}
	// The multipart reader reads in 4 KiB steps; a large buffer in front
	// of the body saves most of the socket reads of a big upload.
	mr := multipart.NewReader(bufio.NewReaderSize(r.Body, ioChunk), boundary)
	var written []entry
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, failf(http.StatusBadRequest, "reading multipart body: %v", err)
		}
		name, filename := partNames(part.Header.Get("Content-Disposition"))
		if name != "file" {
			part.Close()
			continue
		}
		target := filename
		if queryPath != "" && len(written) == 0 {
			target = queryPath // a single-file write names its destination in the query
		}
		if target == "" {
			return nil, failf(http.StatusBadRequest, "a file part has no filename and no path was given")
		}
		dst := u.ResolvePath(target, h.settings.DefaultWorkdir())
		if seen[dst] {
			return nil, failf(http.StatusBadRequest, "path '%s' appears more than once in one upload", dst)
		}
		seen[dst] = true
		if err := writeFile(u, dst, part, meta); err != nil {
			return nil, err
		}
		part.Close()
		written = append(written, entry{Path: dst, Name: filepath.Base(dst), Type: "file", Metadata: meta})
	}
	if len(written) == 0 {
		return nil, failf(http.StatusBadRequest, "the multipart body has no part named \"file\"")
	}
	return written, nil
}

// partNames reads a part's form name and filename verbatim:
// multipart.Part.FileName would strip the directories that carry the
// destination, and undici does not percent-encode it reliably.
func partNames(disposition string) (name, filename string) {
	_, params, err := mime.ParseMediaType(disposition)
	if err != nil {
		return "", ""
	}
	return params["name"], params["filename"]
}

// parseMetadata collects X-Metadata-<key> headers.
func parseMetadata(h http.Header) (map[string]string, error) {
	var meta map[string]string
	total := 0
	for k, vs := range h {
		key, ok := strings.CutPrefix(strings.ToLower(k), "x-metadata-")
		if !ok || len(vs) == 0 {
			continue
		}
		val := vs[0]
		if key == "" || len(key) > maxMetadataKey {
			return nil, failf(http.StatusBadRequest, "metadata key %q must be 1 to %d bytes", key, maxMetadataKey)
		}
		if !printable(key) || !printable(val) {
			return nil, failf(http.StatusBadRequest, "metadata %q must be printable ASCII", key)
		}
		total += len(key) + len(val)
		if total > maxMetadataTotal {
			return nil, failf(http.StatusBadRequest, "metadata exceeds %d bytes", maxMetadataTotal)
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[key] = val
	}
	return meta, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// writeFile streams r into dst for user u: into a temporary file beside
// dst, renamed over dst once complete, so a failed upload leaves no partial
// file. Missing parent directories are created for the user; an existing
// file keeps its permission bits; meta replaces the file's metadata.
func writeFile(u *users.User, dst string, r io.Reader, meta map[string]string) error {
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(dst); err == nil {
		if fi.IsDir() {
			return failf(http.StatusBadRequest, "path '%s' is a directory", dst)
		}
		mode = fi.Mode().Perm()
	}
	dir := filepath.Dir(dst)
	if err := u.MkdirAll(dir, 0o755); err != nil {
		return fsFailure(err, "creating directory '%s'", dir)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".upload-*")
	if err != nil {
		return fsFailure(err, "creating '%s'", dst)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := copyChunked(tmp, r); err != nil {
		return fsFailure(err, "writing '%s'", dst)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fsFailure(err, "writing '%s'", dst)
	}
	if err := u.Chown(tmp.Name()); err != nil {
		return fsFailure(err, "writing '%s'", dst)
	}
	for k, v := range meta {
		if err := unix.Fsetxattr(int(tmp.Fd()), metadataXattrPrefix+k, []byte(v), 0); err != nil {
			return fsFailure(err, "setting metadata on '%s'", dst)
		}
	}
	if err := tmp.Close(); err != nil {
		return fsFailure(err, "writing '%s'", dst)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fsFailure(err, "writing '%s'", dst)
	}
	ok = true
	return nil
}

// ioChunk is the unit of upload I/O.
const ioChunk = 1 << 20

// copyChunked copies r to f in writes of up to ioChunk bytes: multipart
// parts yield a few KiB per Read, and a write per Read would cost a
// syscall every 4 KiB.
func copyChunked(f *os.File, r io.Reader) error {
	buf := make([]byte, ioChunk)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if _, werr := f.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return nil
		default:
			return err
		}
	}
}

// fsFailure maps a filesystem error to an HTTP status.
func fsFailure(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...) + ": " + err.Error()
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &statusError{http.StatusInsufficientStorage, msg}
	case errors.Is(err, fs.ErrPermission):
		return &statusError{http.StatusForbidden, msg}
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENAMETOOLONG):
		return &statusError{http.StatusBadRequest, msg}
	case errors.Is(err, syscall.ENOTSUP):
		return &statusError{http.StatusBadRequest, msg}
	}
	return err
}

// composeRequest is the body of POST /files/compose.
type composeRequest struct {
	SourcePaths []string `json:"source_paths"`
	Destination string   `json:"destination"`
	Username    string   `json:"username"`
}

// compose concatenates source files into a destination and removes them.
func (h *Handler) compose(w http.ResponseWriter, r *http.Request) {
	var req composeRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if len(req.SourcePaths) == 0 || req.Destination == "" {
		writeError(w, http.StatusBadRequest, "source_paths and destination are required")
		return
	}
	q := r.URL.Query()
	if req.Username != "" {
		q.Set("username", req.Username)
		r.URL.RawQuery = q.Encode()
	}
	u, ok := h.authorize(w, r, "write")
	if !ok {
		return
	}
	wd := h.settings.DefaultWorkdir()
	var sources []string
	var readers []io.Reader
	for _, p := range req.SourcePaths {
		src := u.ResolvePath(p, wd)
		f, err := os.Open(src)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				writeError(w, http.StatusNotFound, "source '"+src+"' not found")
			} else {
				writeFailure(w, fsFailure(err, "opening '%s'", src))
			}
			return
		}
		defer f.Close()
		sources = append(sources, src)
		readers = append(readers, f)
	}
	dst := u.ResolvePath(req.Destination, wd)
	if err := writeFile(u, dst, io.MultiReader(readers...), nil); err != nil {
		writeFailure(w, err)
		return
	}
	for _, src := range sources {
		if src != dst {
			_ = os.Remove(src)
		}
	}
	writeJSON(w, entry{Path: dst, Name: filepath.Base(dst), Type: "file"})
}
