package files

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// download serves GET (and HEAD) /files?path=…: the file's bytes as
// application/octet-stream, with Range and conditional requests handled
// by http.ServeContent.
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	u, q, ok := h.authorize(w, r, "read")
	if !ok {
		return
	}
	path := u.ResolvePath(q.Path, h.settings.DefaultWorkdir())
	// Stat before opening: opening a FIFO for reading would block until a
	// writer turns up.
	fi, err := os.Stat(path)
	if err != nil {
		writeOpenError(w, path, err)
		return
	}
	if fi.IsDir() {
		writeError(w, http.StatusBadRequest, "path '"+path+"' is a directory")
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, http.StatusBadRequest, "path '"+path+"' is not a regular file")
		return
	}
	useGzip, acceptable := responseEncoding(r)
	if !acceptable {
		writeError(w, http.StatusNotAcceptable, "no acceptable content encoding: only identity and gzip are supported")
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeOpenError(w, path, err)
		return
	}
	defer f.Close()
	hdr := w.Header()
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(path)}))
	hdr.Set("Vary", "Accept-Encoding")
	switch {
	case fi.Size() == 0:
		serveUnsized(w, r, f, useGzip)
	case useGzip:
		hdr.Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
		stream(w, r, f, true)
	default:
		http.ServeContent(w, r, "", fi.ModTime(), f)
	}
}

func writeOpenError(w http.ResponseWriter, path string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, "file '"+path+"' not found")
	case errors.Is(err, fs.ErrPermission):
		writeError(w, http.StatusForbidden, err.Error())
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ELOOP):
		// A bad path: one that runs through a regular file, has a NUL
		// byte, a name too long, or a symlink loop.
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// serveUnsized serves a file whose size is 0: either really empty, which
// the SDK wants announced with Content-Length: 0, or a procfs/sysfs file
// whose size is unknown until read (and which cannot seek to its end, so
// ServeContent would fail). Reading first tells the two apart.
func serveUnsized(w http.ResponseWriter, r *http.Request, f *os.File, useGzip bool) {
	first := make([]byte, 64<<10)
	n, err := io.ReadFull(f, first)
	switch {
	case err == io.EOF:
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
	case err != nil && err != io.ErrUnexpectedEOF:
		writeError(w, http.StatusInternalServerError, "reading: "+err.Error())
	case err == io.ErrUnexpectedEOF && !useGzip:
		// All of it came in the first read: send it with its length.
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = w.Write(first[:n])
		}
	default:
		stream(w, r, io.MultiReader(bytes.NewReader(first[:n]), f), useGzip)
	}
}

// stream sends src with status 200 and no Content-Length, gzipped if asked.
// A read error after the headers are out aborts the connection, so the
// client sees a failed transfer rather than a cleanly ended short body.
func stream(w http.ResponseWriter, r *http.Request, src io.Reader, useGzip bool) {
	var out io.Writer = w
	var gz *gzip.Writer
	if useGzip {
		w.Header().Set("Content-Encoding", "gzip")
		// BestSpeed: the default level compresses at ~40-100 MB/s, a
		// bottleneck on any link faster than a slow WAN; level 1 keeps
		// ~350-450 MB/s for most of the size reduction.
		gz, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
		out = gz
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := io.Copy(out, src); err != nil {
		panic(http.ErrAbortHandler)
	}
	if gz != nil {
		if err := gz.Close(); err != nil {
			panic(http.ErrAbortHandler)
		}
	}
}
