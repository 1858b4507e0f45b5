package files

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
)

// composeRequest is the body of POST /files/compose.
type composeRequest struct {
	SourcePaths []string `json:"source_paths"`
	Destination string   `json:"destination"`
	Username    string   `json:"username"`
}

// compose serves POST /files/compose: it concatenates the source files, in
// order, into the destination (written like an upload: atomically, owned
// by the user) and then removes the sources. A source may be named twice
// or be the destination itself.
func (h *Handler) compose(w http.ResponseWriter, r *http.Request) {
	if !h.authenticateToken(w, r) {
		return
	}
	var req composeRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if len(req.SourcePaths) == 0 || req.Destination == "" {
		writeError(w, http.StatusBadRequest, "source_paths and destination are required")
		return
	}
	name := req.Username
	if name == "" {
		q, err := parseFileQuery(r.URL.RawQuery)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		name = q.Username
	}
	u, ok := h.user(w, name)
	if !ok {
		return
	}
	wd := h.settings.DefaultWorkdir()
	var sources []string
	var readers []io.Reader
	for _, p := range req.SourcePaths {
		src := u.ResolvePath(p, wd)
		f, err := openRegular(src)
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
	for _, src := range sources {
		if src == dst {
			// The destination is written in place: it would be truncated
			// before it is read.
			writeError(w, http.StatusBadRequest, "destination '"+dst+"' is also a source")
			return
		}
	}
	if err := writeFile(u, dst, io.MultiReader(readers...), nil); err != nil {
		writeFailure(w, err)
		return
	}
	for _, src := range sources {
		_ = os.Remove(src)
	}
	writeJSON(w, entry{Path: dst, Name: filepath.Base(dst), Type: "file"})
}

// openRegular opens path for reading if it is a regular file; it checks
// first because opening a FIFO would block.
func openRegular(path string) (*os.File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, failf(http.StatusBadRequest, "source '%s' is not a regular file", path)
	}
	return os.Open(path)
}
