package rootpath

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Open opens name, resolved inside the root, with open(2) flags and, when
// they create a file, mode perm (before the umask). With O_CREAT|O_EXCL
// a link at name is not followed: the call fails.
func (r *Root) Open(name string, flags int, perm os.FileMode) (*os.File, error) {
	n := clean(name)
	fd, err := r.openat2(n, uint64(flags), uint32(perm.Perm()))
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path.Join(r.dir, n)), nil
}

// Parent opens the directory holding name (resolved inside the root,
// O_PATH: for *at calls) and returns it with name's last component, which
// the caller then works on with *at calls that do not follow it. The
// root itself has no parent: an error.
func (r *Root) Parent(name string) (*os.File, string, error) {
	n := clean(name)
	if n == "" {
		return nil, "", fmt.Errorf("rootpath: %s: the root has no parent", r.dir)
	}
	dir, err := r.Open(path.Dir(n), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, "", err
	}
	return dir, path.Base(n), nil
}

// MkdirAllNoLinks makes sure directory name exists inside the root as
// named: every component must be a directory or missing (then created
// with mode perm, before the umask), never a symbolic link. A mount
// point made so is where its name says, whatever links the tree holds.
func (r *Root) MkdirAllNoLinks(name string, perm os.FileMode) error {
	n := clean(name)
	if n == "" {
		return nil
	}
	dir, err := unix.Openat(r.fd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: r.dir, Err: err}
	}
	defer func() { unix.Close(dir) }()
	done := ""
	for _, c := range strings.Split(n, "/") {
		done = path.Join(done, c)
		err := unix.Mkdirat(dir, c, uint32(perm.Perm()))
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "mkdirat", Path: path.Join(r.dir, done), Err: err}
		}
		// O_NOFOLLOW with O_PATH opens a link itself; O_DIRECTORY then
		// refuses it (ENOTDIR), as it refuses any other non-directory.
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) {
				return fmt.Errorf("rootpath: /%s in %s is not a directory (a symbolic link or a file)", done, r.dir)
			}
			return &os.PathError{Op: "open", Path: path.Join(r.dir, done), Err: err}
		}
		unix.Close(dir)
		dir = next
	}
	return nil
}
