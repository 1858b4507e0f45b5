package files

import (
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// download serves GET /files?path=…
//
// Compression: undici (the SDK's HTTP client) sends "gzip, deflate" with
// every request, while the SDK's read({gzip: true}) sends exactly "gzip".
// Compressing every default read would cap download throughput at gzip's
// speed (far below the loopback or LAN), so only the explicit request is
// compressed.
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	u, ok := h.authorize(w, r, "read")
	if !ok {
		return
	}
	path := u.ResolvePath(r.URL.Query().Get("path"), h.settings.DefaultWorkdir())
	f, err := os.Open(path)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			writeError(w, http.StatusNotFound, "file '"+path+"' not found")
		case errors.Is(err, fs.ErrPermission):
			writeError(w, http.StatusForbidden, err.Error())
		default:
			writeError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if fi.IsDir() {
		writeError(w, http.StatusBadRequest, "path '"+path+"' is a directory")
		return
	}
	accept := r.Header.Get("Accept-Encoding")
	useGzip := strings.TrimSpace(accept) == "gzip"
	if !useGzip && identityRefused(accept) {
		if acceptsGzip(accept) {
			useGzip = true
		} else {
			writeError(w, http.StatusNotAcceptable, "no acceptable content encoding: only identity and gzip are supported")
			return
		}
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(path)}))
	hdr.Set("Vary", "Accept-Encoding")
	if useGzip && fi.Size() > 0 {
		hdr.Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		if _, err := io.Copy(gz, f); err != nil {
			return // the client went away; headers are already sent
		}
		_ = gz.Close()
		return
	}
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// codings parses an Accept-Encoding header into coding → q>0.
func codings(header string) map[string]bool {
	out := map[string]bool{}
	for _, part := range strings.Split(header, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		ok := true
		if q, found := strings.CutPrefix(strings.TrimSpace(params), "q="); found {
			q = strings.TrimSpace(q)
			ok = q != "0" && q != "0.0" && q != "0.00" && q != "0.000"
		}
		out[name] = ok
	}
	return out
}

func identityRefused(header string) bool {
	c := codings(header)
	if ok, listed := c["identity"]; listed {
		return !ok
	}
	if ok, listed := c["*"]; listed {
		return !ok
	}
	return false
}

func acceptsGzip(header string) bool {
	c := codings(header)
	if ok, listed := c["gzip"]; listed {
		return ok
	}
	return c["*"]
}
