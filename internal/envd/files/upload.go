package files

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/envd/users"
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
	u, q, ok := h.authorize(w, r, "write")
	if !ok {
		return
	}
	meta, err := parseMetadata(r.Header)
	if err != nil {
		writeFailure(w, err)
		return
	}
	queryPath := q.Path
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid Content-Type: "+err.Error())
		return
	}
	if mediaType != "multipart/form-data" && mediaType != "application/octet-stream" {
		writeError(w, http.StatusBadRequest, "unsupported Content-Type "+strconv.Quote(mediaType)+": use multipart/form-data or application/octet-stream")
		return
	}
	// The SDK compresses only raw bodies, but decoding before the split
	// costs nothing and treats both variants alike.
	body, err := decodedBody(r)
	if err != nil {
		writeFailure(w, err)
		return
	}
	defer body.Close()
	var written []entry
	if mediaType == "multipart/form-data" {
		written, err = h.uploadMultipart(body, params["boundary"], u, queryPath, meta)
	} else {
		written, err = h.uploadRaw(body, u, queryPath, meta)
	}
	if err != nil {
		writeFailure(w, err)
		return
	}
	writeJSON(w, written)
}

// decodedBody undoes the request's Content-Encoding: none or gzip.
func decodedBody(r *http.Request) (io.ReadCloser, error) {
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return r.Body, nil
	case "gzip", "x-gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, failf(http.StatusBadRequest, "invalid gzip body: %v", err)
		}
		return gz, nil
	default:
		return nil, failf(http.StatusBadRequest, "unsupported Content-Encoding %q: only gzip is supported", enc)
	}
}

func (h *Handler) uploadRaw(body io.Reader, u *users.User, queryPath string, meta map[string]string) ([]entry, error) {
	if queryPath == "" {
		return nil, failf(http.StatusBadRequest, "the path query parameter is required for application/octet-stream uploads")
	}
	dst := u.ResolvePath(queryPath, h.settings.DefaultWorkdir())
	if err := writeFile(u, dst, body, meta); err != nil {
		return nil, err
	}
	return []entry{{Path: dst, Name: filepath.Base(dst), Type: "file", Metadata: meta}}, nil
}

func (h *Handler) uploadMultipart(body io.Reader, boundary string, u *users.User, queryPath string, meta map[string]string) ([]entry, error) {
	if boundary == "" {
		return nil, failf(http.StatusBadRequest, "multipart Content-Type has no boundary")
	}
	// The multipart reader reads in 4 KiB steps; a large buffer in front
	// of the body saves most of the socket reads of a big upload.
	mr := multipart.NewReader(bufio.NewReaderSize(body, ioChunk), boundary)
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
		// A single-file write names its destination in the query, which
		// then wins over every part's filename: a second file part lands
		// on the same path and is refused below, as infra's envd does.
		target := filename
		if queryPath != "" {
			target = queryPath
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
