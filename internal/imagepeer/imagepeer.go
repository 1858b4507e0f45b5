// Package imagepeer moves a built template's image between the nodes of a
// cluster: the node that built it serves the image's record and its
// layers on its internal address (Handler), and a node asked to start a
// sandbox of a template it does not have pulls them from there (Puller),
// once: the layers stay in its image store like its own.
//
// A layer travels as a tar stream in the form internal/layertar unpacks
// (overlayfs whiteouts as character devices 0:0, an opaque directory as a
// ".wh..wh..opq" entry); a checkpoint (snapshot.go) as the data of its
// files, holes left out. Each stream carries its SHA-256 in a trailer that
// the puller checks before the layer or checkpoint is renamed into place:
// one cut short or damaged on the way is never used. What layertar does
// not take is lost on the way: extended attributes other than
// security.capability (user.*, ACLs). A layer's sparse files keep their
// holes (sparse.go): a file's holes are lengths on the wire and are never
// written by the puller.
//
// Disk. A pull asks the image store's space guard (the node's disk
// reserve, --disk-reserve-mb) before it starts and again after every
// guardEvery bytes of the stream; what it writes is at most what it
// reads, so it stops within guardEvery of the reserve, and its partial
// layer or checkpoint is removed.
package imagepeer

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/image"
)

// Prefix is where Handler serves, on a node's internal address.
const Prefix = "/images/"

// DigestTrailer carries the SHA-256 of a layer's tar stream.
const DigestTrailer = "Warren-Layer-Digest"

// Handler serves images' records (GET /images/templates/ID), layers
// (GET /images/layers/ID) and checkpoints (GET /images/snapshots/ID) from
// images. It belongs behind the cluster's authentication
// (internal/noderpc, cluster.PurposeImages), which signs its answers: a
// layer or checkpoint changed on the way fails the puller's read.
func Handler(images *image.Store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		kind, id, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, Prefix), "/")
		if !image.ValidID(id) {
			http.Error(w, "invalid id", http.StatusBadRequest)
			return
		}
		switch kind {
		case "templates":
			t, err := images.Template(id)
			if errors.Is(err, image.ErrNotFound) {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(t)
		case "layers":
			holes := r.Header.Get(HolesHeader) == "1"
			serveDir(w, images.LayerDir(id), "application/x-tar", func(out io.Writer, dir string) error {
				return writeLayer(out, dir, holes)
			})
		case "snapshots":
			serveDir(w, images.SnapshotDir(id), "application/octet-stream", writeSnapshot)
		default:
			http.NotFound(w, r)
		}
	})
}

// serveDir streams dir with write, the stream's digest in the trailer.
func serveDir(w http.ResponseWriter, dir, contentType string, write func(io.Writer, string) error) {
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		http.Error(w, "no "+filepath.Base(dir), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Trailer", DigestTrailer)
	h := sha256.New()
	if err := write(io.MultiWriter(w, h), dir); err != nil {
		return // the status is sent: the missing trailer tells the puller
	}
	w.Header().Set(DigestTrailer, hex.EncodeToString(h.Sum(nil)))
}

// writeLayer writes the layer at root as a tar stream, entries sorted by
// name, never following a symbolic link; with holes, its sparse files as
// holes and data (sparse.go).
func writeLayer(out io.Writer, root string, holes bool) error {
	tw := tar.NewWriter(out)
	links := map[[2]uint64]string{}
	var walk func(rel string) error
	walk = func(rel string) error {
		p := filepath.Join(root, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		hdr, err := header(p, rel, fi, links)
		if err != nil {
			return err
		}
		if hdr == nil {
			return nil // a socket, or a device that is not a whiteout
		}
		if hdr.Typeflag == tar.TypeReg {
			return writeFile(tw, p, hdr, holes)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			if v, err := getxattr(p, "trusted.overlay.opaque"); err == nil && v == "y" {
				opq := &tar.Header{Name: filepath.Join(rel, ".wh..wh..opq"), Typeflag: tar.TypeReg, Mode: 0o600, ModTime: fi.ModTime()}
				if err := tw.WriteHeader(opq); err != nil {
					return err
				}
			}
			entries, err := os.ReadDir(p)
			if err != nil {
				return err
			}
			names := make([]string, len(entries))
			for i, e := range entries {
				names[i] = e.Name()
			}
			sort.Strings(names)
			for _, n := range names {
				if err := walk(filepath.Join(rel, n)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk("."); err != nil {
		return err
	}
	return tw.Close()
}

// writeFile writes the regular file at p, its header hdr: whole, or with
// holes (a file that has some) as a sparse body.
func writeFile(tw *tar.Writer, p string, hdr *tar.Header, holes bool) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if !holes || st.Size != hdr.Size || st.Blocks*512 >= st.Size {
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		return err
	}
	segs, err := fileSegments(f, st.Size)
	if err != nil {
		return err
	}
	h := *hdr
	h.PAXRecords = maps.Clone(hdr.PAXRecords)
	if h.PAXRecords == nil {
		h.PAXRecords = map[string]string{}
	}
	h.PAXRecords[sparseSizeKey] = strconv.FormatInt(st.Size, 10)
	h.Size = sparseBodyLen(segs)
	if err := tw.WriteHeader(&h); err != nil {
		return err
	}
	return writeSparseBody(tw, f, segs)
}

// header is the tar header of the entry at p (rel in the layer); nil for
// what a layer does not carry.
func header(p, rel string, fi fs.FileInfo, links map[[2]uint64]string) (*tar.Header, error) {
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return nil, err
		}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("imagepeer: %s: no stat", rel)
	}
	switch fi.Mode().Type() {
	case fs.ModeSocket:
		return nil, nil
	case fs.ModeDevice | fs.ModeCharDevice:
		if st.Rdev != 0 {
			return nil, nil
		}
	case fs.ModeDevice:
		return nil, nil
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return nil, err
	}
	hdr.Name = rel
	// Reading a layer changes its files' access times: without them, a
	// layer's stream is the same each time, and so is its blob in the
	// store (internal/imageblob), which a later build reusing the layer
	// from the cache then finds there. The puller sets access times to
	// the modification times.
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	if fi.IsDir() && rel != "." {
		hdr.Name = rel + "/"
	} else if rel == "." {
		hdr.Name = "./"
	}
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	if fi.Mode().IsRegular() && st.Nlink > 1 {
		key := [2]uint64{uint64(st.Dev), st.Ino}
		if first, ok := links[key]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
		} else {
			links[key] = rel
		}
	}
	if v, err := getxattr(p, "security.capability"); err == nil && hdr.Typeflag == tar.TypeReg {
		hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": v}
	}
	return hdr, nil
}

// getxattr reads an extended attribute of p itself (not of a link's
// target).
func getxattr(p, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}
