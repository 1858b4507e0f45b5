package files

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/warren-sandbox/warren/internal/envd/users"
	"golang.org/x/sys/unix"
)

// writeFile streams r into dst for user u, in place, as E2B's envd does:
// the file keeps its inode (hard links, open readers and `tail -f` follow
// it) and a directory watcher sees a WRITE of that file, which the SDK's
// users wait for. Missing parent directories are created for the user; an
// existing file keeps its permission bits; meta replaces the file's
// metadata. If the body fails (truncated, client gone), a file this upload
// created is removed; an existing file is left as far as it was written.
func writeFile(u *users.User, dst string, r io.Reader, meta map[string]string) error {
	existed := false
	if fi, err := os.Stat(dst); err == nil {
		if fi.IsDir() {
			return failf(http.StatusBadRequest, "path '%s' is a directory", dst)
		}
		if !fi.Mode().IsRegular() {
			// Devices, FIFOs and sockets are not files to upload into.
			return failf(http.StatusBadRequest, "path '%s' is not a regular file", dst)
		}
		existed = true
	}
	dir := filepath.Dir(dst)
	if err := u.MkdirAll(dir, 0o755); err != nil {
		return fsFailure(err, "creating directory '%s'", dir)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fsFailure(err, "opening '%s'", dst)
	}
	ok := false
	defer func() {
		f.Close()
		if !ok && !existed {
			os.Remove(dst)
		}
	}()
	if err := u.Chown(dst); err != nil {
		return fsFailure(err, "writing '%s'", dst)
	}
	if err := replaceMetadata(f, meta); err != nil {
		return fsFailure(err, "setting metadata on '%s'", dst)
	}
	if err := copyChunked(f, r); err != nil {
		return fsFailure(err, "writing '%s'", dst)
	}
	if err := f.Close(); err != nil {
		return fsFailure(err, "writing '%s'", dst)
	}
	ok = true
	return nil
}

// replaceMetadata removes the file's user.e2b.* attributes and sets meta.
func replaceMetadata(f *os.File, meta map[string]string) error {
	fd := int(f.Fd())
	if size, err := unix.Flistxattr(fd, nil); err == nil && size > 0 {
		buf := make([]byte, size)
		if size, err = unix.Flistxattr(fd, buf); err == nil {
			for _, name := range strings.Split(string(buf[:size]), "\x00") {
				if strings.HasPrefix(name, metadataXattrPrefix) {
					if err := unix.Fremovexattr(fd, name); err != nil {
						return err
					}
				}
			}
		}
	}
	for k, v := range meta {
		if err := unix.Fsetxattr(fd, metadataXattrPrefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// ioChunk is the unit of upload I/O.
const ioChunk = 1 << 20

// bodyError marks a failure to read the upload body (truncated, bad gzip,
// client gone), as opposed to a failure to write the file: the former is
// the client's fault (400), the latter depends on the filesystem.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return "reading upload body: " + e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// copyChunked copies r to f in writes of up to ioChunk bytes: multipart
// parts yield a few KiB per Read, and a write per Read would cost a
// syscall every 4 KiB. Only a clean io.EOF from r ends the copy; any other
// read error (notably io.ErrUnexpectedEOF from a truncated part or gzip
// stream) is a *bodyError, so the caller discards the temporary file.
func copyChunked(f *os.File, r io.Reader) error {
	buf := make([]byte, ioChunk)
	for {
		n, rerr := fill(r, buf)
		if n > 0 {
			if _, err := f.Write(buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return &bodyError{rerr}
		}
	}
}

// fill reads into buf until it is full or r fails. Unlike io.ReadFull it
// passes r's own error through unchanged, so io.EOF means r ended cleanly.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// fsFailure maps a filesystem error to an HTTP status.
func fsFailure(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...) + ": " + err.Error()
	var be *bodyError
	switch {
	case errors.As(err, &be):
		return &statusError{http.StatusBadRequest, msg}
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &statusError{http.StatusInsufficientStorage, msg}
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		// 403, not 401: the caller is authenticated, the filesystem says
		// no. The SDK shows it as SandboxError("403: ...").
		return &statusError{http.StatusForbidden, msg}
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENAMETOOLONG),
		notDirectory(err):
		return &statusError{http.StatusBadRequest, msg}
	case errors.Is(err, syscall.ENOTSUP), errors.Is(err, syscall.EINVAL):
		// No xattr support for metadata; a NUL byte in the path.
		return &statusError{http.StatusBadRequest, msg}
	}
	return err
}

// notDirectory recognises users.MkdirAll's report that an existing parent
// is not a directory, which carries a plain error rather than ENOTDIR.
func notDirectory(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && pe.Err.Error() == syscall.ENOTDIR.Error()
}
