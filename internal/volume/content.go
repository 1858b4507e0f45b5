package volume

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/rootpath"
)

// What the content API does to a volume's tree, with E2B's semantics
// (infra's orchestrator volume service): defaults 9090:9090, directories
// 0777 and files 0666; a directory is listed to a depth of 1 to 10.

// Defaults of what the content API creates.
const (
	DefaultUID      = 9090
	DefaultGID      = 9090
	DefaultDirMode  = 0o777
	DefaultFileMode = 0o666
	MaxDepth        = 10
	// MaxListEntries bounds one listing.
	MaxListEntries = 10000
	// maxPath bounds a content path's length.
	maxPath = 4096
	// modeBits are the mode bits a request may set: permissions and the
	// sticky bit; setuid and setgid are refused.
	modeBits = 0o1777
)

// Tree is one volume's files, open for the content API. Paths are the
// volume's ("/" is its root), resolved inside it.
type Tree struct {
	root *rootpath.Root
}

// OpenTree opens dir, a volume's tree on the host, for content requests.
// The Manager's Tree does this for a volume, its file system mounted.
func OpenTree(dir string) (*Tree, error) {
	root, err := rootpath.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("volume: %w", err)
	}
	return &Tree{root: root}, nil
}

// Close releases the tree.
func (t *Tree) Close() error { return t.root.Close() }

// Entry describes a file, directory or link in a volume.
type Entry struct {
	Name, Path string
	// Type is "file", "directory", "symlink" or "unknown". A link has
	// its target's type (unknown if it leads nowhere), and Target.
	Type                string
	Size                int64
	Mode                uint32
	UID, GID            uint32
	Atime, Mtime, Ctime time.Time
	Target              *string
}

// Owner is who and what mode content requests make things with; nil
// fields take the defaults.
type Owner struct {
	UID, GID, Mode *uint32
}

func (o Owner) resolve(defMode uint32) (uid, gid, mode uint32, err error) {
	uid, gid, mode = DefaultUID, DefaultGID, defMode
	if o.UID != nil {
		uid = *o.UID
	}
	if o.GID != nil {
		gid = *o.GID
	}
	if o.Mode != nil {
		mode = *o.Mode
	}
	return uid, gid, mode, checkOwner(uid, gid, mode)
}

func checkOwner(uid, gid, mode uint32) error {
	// (uid_t)-1 means "leave unchanged" to chown(2).
	if uid == ^uint32(0) || gid == ^uint32(0) {
		return fmt.Errorf("%w: uid and gid must be below 4294967295", ErrInvalid)
	}
	if mode&^modeBits != 0 {
		return fmt.Errorf("%w: mode %#o has bits beyond 0o1777 (setuid and setgid are refused)", ErrInvalid, mode)
	}
	return nil
}

// CleanPath turns a request's path into the volume's absolute path. ".."
// is refused (inside the volume it could mean nothing else than what a
// plain path says, so a client sending it is confused or probing), as
// are NUL bytes and paths longer than 4096 bytes.
func CleanPath(p string) (string, error) {
	if len(p) > maxPath {
		return "", fmt.Errorf("%w: the path is longer than %d bytes", ErrInvalid, maxPath)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: the path holds a NUL byte", ErrInvalid)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: the path %q holds '..': paths are inside the volume", ErrInvalid, p)
		}
	}
	return path.Clean("/" + p), nil
}

// fail maps a system call's error on volume path p to this package's.
func fail(op, p string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %s: %s", ErrPathNotFound, op, p)
	case errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOTEMPTY):
		return fmt.Errorf("%w: %s: %s exists", ErrConflict, op, p)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: %s: a component of %s is not a directory", ErrInvalid, op, p)
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("%w: %s: %s is a directory", ErrInvalid, op, p)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w: %s: too many symbolic links in %s", ErrInvalid, op, p)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: %s: %s leads out of the volume", ErrInvalid, op, p)
	case errors.Is(err, unix.ENAMETOOLONG):
		return fmt.Errorf("%w: %s: a name in %s is too long", ErrInvalid, op, p)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("%w: %s: the volume is full", ErrNoSpace, op)
	}
	return fmt.Errorf("volume: %s %s: %w", op, p, err)
}

// Stat describes the entry at p.
func (t *Tree) Stat(p string) (Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	f, err := t.root.Open(p, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return Entry{}, fail("stat", p, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Entry{}, fail("stat", p, err)
	}
	e := entryOf(p, &st)
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		// An O_PATH descriptor of a link: readlinkat reads the link.
		if target, err := readlinkFd(int(f.Fd()), ""); err == nil {
			t.describeLink(&e, target)
		}
	}
	return e, nil
}

// describeLink sets a link's target (as written) and the type and mode
// of what it leads to inside the volume.
func (t *Tree) describeLink(e *Entry, target string) {
	e.Target = &target
	e.Type, e.Mode = "unknown", 0
	f, err := t.root.Open(e.Path, unix.O_PATH, 0)
	if err != nil {
		return
	}
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) == nil {
		e.Type, e.Mode = typeOf(st.Mode), st.Mode&0o7777
	}
}

func readlinkFd(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func entryOf(p string, st *unix.Stat_t) Entry {
	name := path.Base(p)
	if p == "/" {
		name = "/"
	}
	return Entry{
		Name: name, Path: p, Type: typeOf(st.Mode), Size: st.Size, Mode: st.Mode & 0o7777,
		UID: st.Uid, GID: st.Gid,
		Atime: time.Unix(st.Atim.Unix()).UTC(), Mtime: time.Unix(st.Mtim.Unix()).UTC(), Ctime: time.Unix(st.Ctim.Unix()).UTC(),
	}
}

func typeOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "unknown"
}

// List lists the directory at p and, depth levels down, the directories
// in it (links are listed, not followed), each directory's entries sorted
// by name and followed by its own. depth 0 means 1.
func (t *Tree) List(p string, depth int) ([]Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return nil, err
	}
	if depth == 0 {
		depth = 1
	}
	if depth < 1 || depth > MaxDepth {
		return nil, fmt.Errorf("%w: depth must be between 1 and %d", ErrInvalid, MaxDepth)
	}
	dir, err := t.root.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fail("list", p, err)
	}
	defer dir.Close()
	out := []Entry{}
	return out, t.list(dir, p, depth, &out)
}

func (t *Tree) list(dir *os.File, p string, depth int, out *[]Entry) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return fail("list", p, err)
	}
	if len(*out)+len(names) > MaxListEntries {
		return fmt.Errorf("%w: more than %d entries: list with a smaller depth or a deeper path", ErrInvalid, MaxListEntries)
	}
	sort.Strings(names)
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		child := path.Join(p, name)
		e := entryOf(child, &st)
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if target, err := readlinkFd(int(dir.Fd()), name); err == nil {
				t.describeLink(&e, target)
			}
		}
		*out = append(*out, e)
		if depth > 1 && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			// O_NOFOLLOW: the entry is this directory, not a link put in
			// its place since.
			fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			sub := os.NewFile(uintptr(fd), child)
			err = t.list(sub, child, depth-1, out)
			sub.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// MakeDir makes the directory p. With force, missing parents are made
// (mode 0777, the same owner) and an existing directory is accepted as
// it is; without, an existing p is ErrConflict and a missing parent
// ErrPathNotFound.
func (t *Tree) MakeDir(p string, o Owner, force bool) (Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	uid, gid, mode, err := o.resolve(DefaultDirMode)
	if err != nil {
		return Entry{}, err
	}
	if p == "/" {
		if force {
			return t.Stat(p)
		}
		return Entry{}, fmt.Errorf("%w: the volume's root exists", ErrConflict)
	}
	if force {
		if err := t.makeParents(path.Dir(p), uid, gid); err != nil {
			return Entry{}, err
		}
	}
	err = t.mkdir(p, uid, gid, mode)
	if errors.Is(err, ErrConflict) && force {
		if e, serr := t.Stat(p); serr == nil && e.Type == "directory" {
			return e, nil
		}
	}
	if err != nil {
		return Entry{}, err
	}
	return t.Stat(p)
}

// mkdir makes one directory, owned and moded as asked.
func (t *Tree) mkdir(p string, uid, gid, mode uint32) error {
	parent, base, err := t.root.Parent(p)
	if err != nil {
		return fail("mkdir", p, err)
	}
	defer parent.Close()
	pfd := int(parent.Fd())
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		return fail("mkdir", p, err)
	}
	if err := unix.Fchownat(pfd, base, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail("chown", p, err)
	}
	// Set after the owner (chown may clear mode bits), and so not masked
	// by the umask.
	return chmodAt(pfd, base, mode, p)
}

// chmodAt sets the mode of pfd's entry base, which must not be a link.
func chmodAt(pfd int, base string, mode uint32, p string) error {
	fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("chmod", p, err)
	}
	defer unix.Close(fd)
	return chmodFd(fd, mode, p)
}

// chmodFd sets the mode of what an O_PATH descriptor names (a link has
// no mode of its own: refused by the kernel).
func chmodFd(fd int, mode uint32, p string) error {
	if err := unix.Fchmodat(unix.AT_FDCWD, procFd(fd), mode, 0); err != nil {
		return fail("chmod", p, err)
	}
	return nil
}

func procFd(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// makeParents makes dir and its missing ancestors (0777, uid:gid).
func (t *Tree) makeParents(dir string, uid, gid uint32) error {
	if dir == "/" {
		return nil
	}
	f, err := t.root.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil {
		f.Close()
		return nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return fail("mkdir", dir, err)
	}
	if err := t.makeParents(path.Dir(dir), uid, gid); err != nil {
		return err
	}
	if err := t.mkdir(dir, uid, gid, DefaultDirMode); err != nil && !errors.Is(err, ErrConflict) {
		return err
	}
	return nil
}

// Open opens the regular file at p for reading. Anything else (a
// directory, a device node, a FIFO) is refused without being opened: it
// is looked at through an O_PATH descriptor first, which is then
// reopened.
func (t *Tree) Open(p string) (*os.File, Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return nil, Entry{}, err
	}
	f, err := t.root.Open(p, unix.O_PATH, 0)
	if err != nil {
		return nil, Entry{}, fail("open", p, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, Entry{}, fail("open", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, Entry{}, fmt.Errorf("%w: %s is not a regular file (%s)", ErrInvalid, p, typeOf(st.Mode))
	}
	fd, err := unix.Open(procFd(int(f.Fd())), unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, Entry{}, fail("open", p, err)
	}
	return os.NewFile(uintptr(fd), p), entryOf(p, &st), nil
}

// Write writes the file p from r: into a new file beside it, which then
// replaces p at once, so readers see the old content or the new, and a
// link or device at p is replaced, never written through. Without force
// an existing p is ErrConflict and a missing parent ErrPathNotFound; with
// force, p is replaced and missing parents are made. guard, if not nil,
// is called as the file grows (every 64 MiB): its error stops the write.
func (t *Tree) Write(p string, r io.Reader, o Owner, force bool, guard func(written int64) error) (Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	if p == "/" {
		return Entry{}, fmt.Errorf("%w: the volume's root is a directory", ErrInvalid)
	}
	uid, gid, mode, err := o.resolve(DefaultFileMode)
	if err != nil {
		return Entry{}, err
	}
	if force {
		if err := t.makeParents(path.Dir(p), uid, gid); err != nil {
			return Entry{}, err
		}
	}
	parent, base, err := t.root.Parent(p)
	if err != nil {
		return Entry{}, fail("write", p, err)
	}
	defer parent.Close()
	pfd := int(parent.Fd())
	if !force {
		// Fail early, before the body is read; the final rename checks
		// again.
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			return Entry{}, fmt.Errorf("%w: %s exists (write with force to replace it)", ErrConflict, p)
		}
	}
	tmp := ".warren-upload-" + newToken()[:16]
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return Entry{}, fail("write", p, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	err = fill(f, r, guard)
	if err == nil {
		err = unix.Fchown(fd, int(uid), int(gid))
	}
	if err == nil {
		err = unix.Fchmod(fd, mode)
	}
	if err == nil {
		err = f.Sync() // a volume's data outlives the request
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = replace(pfd, tmp, base, force)
	}
	if err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		if errors.Is(err, ErrNoSpace) {
			return Entry{}, err // the volume's or the guard's
		}
		return Entry{}, fail("write", p, err)
	}
	return t.Stat(p)
}

// fill copies r into f, calling guard as it grows.
func fill(f *os.File, r io.Reader, guard func(int64) error) error {
	const step = 64 << 20
	buf := make([]byte, 1<<20)
	var written int64
	for {
		// Through a plain Writer, so that the 1 MiB buffer is used (the
		// file's ReadFrom would copy 32 KiB at a time).
		n, err := io.CopyBuffer(struct{ io.Writer }{f}, io.LimitReader(r, step), buf)
		written += n
		if err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
				return fmt.Errorf("%w: the volume is full", ErrNoSpace)
			}
			return err
		}
		if n < step {
			return nil
		}
		if guard != nil {
			if err := guard(written); err != nil {
				return err
			}
		}
	}
}

// replace puts tmp at base: over whatever is there with force, else only
// if nothing is.
func replace(pfd int, tmp, base string, force bool) error {
	if force {
		return unix.Renameat(pfd, tmp, pfd, base)
	}
	err := unix.Renameat2(pfd, tmp, pfd, base, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A file system without RENAME_NOREPLACE (NFS): a hard link
		// fails the same way if base exists.
		if err = unix.Linkat(pfd, tmp, pfd, base, 0); err == nil {
			err = unix.Unlinkat(pfd, tmp, 0)
		}
	}
	return err
}

// Chown and chmod what p names (following links inside the volume, as
// E2B's does); nil fields are left as they are.
func (t *Tree) Update(p string, o Owner) (Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	uid, gid := -1, -1
	if o.UID != nil {
		uid = int(*o.UID)
	}
	if o.GID != nil {
		gid = int(*o.GID)
	}
	mode := uint32(0)
	if o.Mode != nil {
		mode = *o.Mode
	}
	if err := checkOwner(uint32(max(uid, 0)), uint32(max(gid, 0)), mode); err != nil {
		return Entry{}, err
	}
	f, err := t.root.Open(p, unix.O_PATH, 0)
	if err != nil {
		return Entry{}, fail("update", p, err)
	}
	defer f.Close()
	fd := int(f.Fd())
	if o.Mode != nil {
		if err := chmodFd(fd, mode, p); err != nil {
			return Entry{}, err
		}
	}
	if uid != -1 || gid != -1 {
		if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
			return Entry{}, fail("chown", p, err)
		}
		if o.Mode != nil {
			// chown clears setgid and the like: the mode asked for wins.
			if err := chmodFd(fd, mode, p); err != nil {
				return Entry{}, err
			}
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Entry{}, fail("update", p, err)
	}
	return entryOf(p, &st), nil
}

// Remove removes p, a directory with everything in it. The volume's root
// cannot be removed.
func (t *Tree) Remove(p string) error {
	p, err := CleanPath(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: the volume's root cannot be removed", ErrInvalid)
	}
	parent, base, err := t.root.Parent(p)
	if err != nil {
		return fail("remove", p, err)
	}
	defer parent.Close()
	pfd := int(parent.Fd())
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail("remove", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(pfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fail("remove", p, err)
		}
		return nil
	}
	// os.RemoveAll works with unlinkat and O_NOFOLLOW below the parent
	// it opens (here through its descriptor): it never follows a link.
	if err := os.RemoveAll(procFd(pfd) + "/" + base); err != nil {
		return fail("remove", p, err)
	}
	return nil
}
