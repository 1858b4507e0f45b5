// Package rootpath reaches into a directory tree that a tenant controls
// (a sandbox's root filesystem) from the host, without ever leaving it.
//
// A path inside a tenant's tree means what it means inside the sandbox:
// its symbolic links, "..", and absolute link targets are resolved with
// the tree as "/". The host opens such paths only through a Root, which
// resolves every one of them with openat2(2) and RESOLVE_IN_ROOT, so a
// link such as /etc/hosts -> /etc/passwd names the tree's own /etc/passwd,
// never the host's. RESOLVE_NO_MAGICLINKS refuses /proc-style links and
// RESOLVE_NO_XDEV refuses to cross into another mount: a root filesystem
// is one mount on the host (its container's mounts live in the
// container's mount namespace).
//
// Files the host writes are replaced, never written in place: the new
// content goes to a fresh file beside the old one, which rename(2) then
// puts over the name. A symbolic or hard link at that name is replaced,
// not followed, and whatever it pointed at is left untouched.
package rootpath

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// resolve are the openat2 resolve flags of every lookup.
const resolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Root is an open directory that paths are resolved inside.
type Root struct {
	dir string
	fd  int
}

// Open opens dir (a host path, trusted) as a Root.
func Open(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &Root{dir: dir, fd: fd}, nil
}

// Close releases the root's file descriptor.
func (r *Root) Close() error { return unix.Close(r.fd) }

// clean makes name (absolute or relative to the root) a relative path
// without "." or "..": "" is the root itself. ".." in name is resolved
// lexically first, which inside the root is what the kernel would do too.
func clean(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// openat2 resolves name inside the root with flags (O_CLOEXEC added),
// retrying the EAGAIN that RESOLVE_IN_ROOT returns when a rename raced
// with a ".." lookup.
func (r *Root) openat2(name string, flags uint64, mode uint32) (int, error) {
	how := &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: uint64(mode), Resolve: resolve}
	if name == "" {
		name = "."
	}
	for attempt := 0; ; attempt++ {
		fd, err := unix.Openat2(r.fd, name, how)
		if errors.Is(err, unix.EAGAIN) && attempt < 16 {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "openat2", Path: r.dir + " (root) /" + name, Err: err}
		}
		return fd, nil
	}
}

// OpenFile opens name, resolved inside the root, for reading.
func (r *Root) OpenFile(name string) (*os.File, error) {
	n := clean(name)
	fd, err := r.openat2(n, unix.O_RDONLY|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path.Join(r.dir, n)), nil
}

// Lstat describes name resolved inside the root, its last component not
// followed if it is a symbolic link.
func (r *Root) Lstat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := r.openat2(clean(name), unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	err = unix.Fstat(fd, &st)
	return st, err
}

// MkdirAll makes sure directory name exists inside the root, creating
// what is missing with mode perm (before the umask), and returns it open
// (O_PATH: for *at calls, not for reading). Existing components, links
// included, are resolved inside the root; a dangling link has its target
// created, as a mount's destination would.
func (r *Root) MkdirAll(name string, perm os.FileMode) (*os.File, error) {
	return r.mkdirAll(clean(name), perm, 0)
}

// maxLinks bounds the links MkdirAll follows, as the kernel's ELOOP does.
const maxLinks = 40

func (r *Root) mkdirAll(n string, perm os.FileMode, links int) (*os.File, error) {
	fd, err := r.openat2(n, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil {
		return os.NewFile(uintptr(fd), path.Join(r.dir, n)), nil
	}
	if !errors.Is(err, unix.ENOENT) || n == "" {
		return nil, err
	}
	parent, err := r.mkdirAll(clean(path.Dir(n)), perm, links)
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	pfd, base := int(parent.Fd()), path.Base(n)
	err = unix.Mkdirat(pfd, base, uint32(perm.Perm()))
	if errors.Is(err, unix.EEXIST) {
		// A dangling symbolic link: make its target, inside the root.
		var st unix.Stat_t
		if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if links >= maxLinks {
				return nil, &os.PathError{Op: "mkdir", Path: path.Join(r.dir, n), Err: unix.ELOOP}
			}
			buf := make([]byte, unix.PathMax)
			k, err := unix.Readlinkat(pfd, base, buf)
			if err != nil {
				return nil, &os.PathError{Op: "readlinkat", Path: path.Join(r.dir, n), Err: err}
			}
			target := string(buf[:k])
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(n), target)
			}
			if _, err := r.mkdirAll(clean(target), perm, links+1); err != nil {
				return nil, err
			}
		}
	} else if err != nil {
		return nil, &os.PathError{Op: "mkdirat", Path: path.Join(r.dir, n), Err: err}
	}
	// Open it again through the root: a concurrent creator may have made
	// it something else than a directory, which this then refuses.
	fd, err = r.openat2(n, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path.Join(r.dir, n)), nil
}

// WriteFile puts a new regular file with data and mode perm at name: its
// directory is resolved inside the root (and created if missing), and
// whatever name's last component was (a file, a symbolic or hard link, a
// device) is replaced, not written through. A directory there is an
// error. The file belongs to the caller (root:root on the host).
func (r *Root) WriteFile(name string, data []byte, perm os.FileMode) error {
	n := clean(name)
	if n == "" {
		return fmt.Errorf("rootpath: %s: the root itself is not a file", r.dir)
	}
	dir, err := r.MkdirAll(path.Dir(n), 0o755)
	if err != nil {
		return err
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	tmp := ".warren-" + randomHex() + ".tmp"
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return &os.PathError{Op: "create", Path: path.Join(r.dir, path.Dir(n), tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = unix.Fchmod(fd, uint32(perm.Perm())) // not masked by the umask
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = unix.Renameat(dfd, tmp, dfd, path.Base(n)); err != nil {
			err = &os.PathError{Op: "rename", Path: path.Join(r.dir, n), Err: err}
		}
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	return nil
}

// EnsureFile makes sure that name is a regular file, for a bind mount to
// cover: an existing regular file is kept; a missing one is created
// empty; a symbolic link or anything else but a directory is replaced by
// an empty file, so that the mount never follows a link.
func (r *Root) EnsureFile(name string, perm os.FileMode) error {
	st, err := r.Lstat(name)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		return nil
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return fmt.Errorf("rootpath: %s in %s is a directory, not a file", clean(name), r.dir)
	case err != nil && !errors.Is(err, unix.ENOENT):
		return err
	}
	return r.WriteFile(name, nil, perm)
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ReadFile reads name, resolved inside the root, if it is a regular file
// of at most max bytes. It never blocks on a FIFO or a device a tenant
// put there (O_NONBLOCK, then a regular-file check).
func (r *Root) ReadFile(name string, max int64) ([]byte, error) {
	n := clean(name)
	fd, err := r.openat2(n, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path.Join(r.dir, n))
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("rootpath: %s in %s is not a regular file", n, r.dir)
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("rootpath: %s in %s is larger than %d bytes", n, r.dir, max)
	}
	return io.ReadAll(io.LimitReader(f, max))
}
