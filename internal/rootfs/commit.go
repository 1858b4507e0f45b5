package rootfs

// Committing a sandbox's writes as a layer.
//
// What a sandbox wrote is its overlay's upper dir, which serves as a
// layer unchanged: deleted files are whiteouts (character devices 0:0)
// and replaced directories are marked opaque (trusted.overlay.opaque),
// which overlayfs honours in lower layers too. The upper dir lives on the
// sandbox's own disk (a limited ext4 image, see Mount), so it cannot be
// renamed into layers/: it is copied, entry by entry, into
// layers/.tmp-commit-<random>/ and that is renamed into place when
// complete, as unpacked layers are (a layer dir that exists is whole; an
// interrupted commit is removed by Cleanup, which spares one whose
// directory is flock'ed by a commit in progress).
//
// The copy keeps what makes the layer mean what the sandbox saw: owners,
// modes (setuid included: sudo must keep working), access and
// modification times, every extended attribute (trusted.overlay.* as
// overlayfs wrote them, security.capability, ACLs, user.*), hard links
// between regular files, symbolic links as they are, holes (a sparse file
// costs only what it holds, never its apparent size), FIFOs and
// whiteouts. Device nodes other than whiteouts and sockets are dropped:
// a layer is host data, and a tenant's block device pointing at the
// host's disk has no business there (a sandbox's /dev is the runtime's).
//
// The tree is the tenant's, so it is walked with file descriptors only:
// every entry is opened or created relative to its parent's descriptor,
// with O_NOFOLLOW, and a symbolic link is only ever read, never followed.
// The container is gone before a commit, so nothing changes the tree
// meanwhile.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// maxCommitDepth bounds the directory nesting of a committed layer. No
// path deeper than this can be used by name (PATH_MAX), and each level
// holds two file descriptors while it is copied.
const maxCommitDepth = 2048

// Commit turns what the sandbox wrote into layer layerID and removes the
// root filesystem. The container must be gone. If layerID already exists
// (another build made the same step meanwhile), that one is kept and this
// one dropped. On failure the root filesystem is still removed and no
// layer is made.
func (r *Root) Commit(layers *image.Store, layerID string) (err error) {
	defer func() {
		if uerr := r.Unmount(); err == nil {
			err = uerr
		}
	}()
	if !image.ValidID(layerID) {
		return fmt.Errorf("rootfs: invalid layer id %q", layerID)
	}
	// Unmounted first: the upper dir must not change while it is copied,
	// and it is the upper dir, not the merged view, that is the layer.
	if err := mountinfo.Unmount(r.merged); err != nil {
		return err
	}
	final := layers.LayerDir(layerID)
	if _, err := os.Lstat(final); err == nil {
		return nil // the same step, made by another build: keep that one
	}
	tmp, err := layers.LayerTemp(image.CommitTempPrefix)
	if err != nil {
		return err
	}
	defer tmp.Close()
	dst := tmp.Dir()
	src, err := os.OpenFile(r.upper, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer src.Close()
	c := &layerCopier{links: map[fileID]string{}}
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return err
	}
	// The root's own attributes last: until then it stays 0700, so no
	// other user reaches into the tree while it is made.
	if err := c.copyDir(src, dst, "", 0); err != nil {
		return fmt.Errorf("rootfs: committing layer %s: %w", layerID, err)
	}
	if err := c.setAttrs(int(src.Fd()), int(dst.Fd()), &st); err != nil {
		return fmt.Errorf("rootfs: committing layer %s: %w", layerID, err)
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, tmp.Path, times(&st), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	// One made meanwhile by another build stays.
	return tmp.Commit(final)
}

// fileID names an inode of the source tree, to keep its hard links.
type fileID struct{ dev, ino uint64 }

// layerCopier copies an upper dir into a new layer.
type layerCopier struct {
	// links maps a regular file with several links to the path (relative
	// to the layer) of its first copy, which later names link to.
	links map[fileID]string
	// dst is the new layer's root, for linkat.
	root *os.File
}

// copyDir copies the entries of directory src (at rel in the tree) into
// dst, and sets the attributes of each; the caller sets dst's own.
func (c *layerCopier) copyDir(src, dst *os.File, rel string, depth int) error {
	if depth == 0 {
		c.root = dst
	}
	if depth > maxCommitDepth {
		return fmt.Errorf("%s: directories nested deeper than %d", rel, maxCommitDepth)
	}
	names, err := src.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	for _, name := range names {
		if err := c.copyEntry(src, dst, name, filepath.Join(rel, name), depth); err != nil {
			return err
		}
	}
	return nil
}

// copyEntry copies src's entry name (at rel in the tree) into dst.
func (c *layerCopier) copyEntry(src, dst *os.File, name, rel string, depth int) error {
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	var err error
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		err = c.copySubdir(src, dst, name, rel, &st, depth)
	case unix.S_IFREG:
		err = c.copyFile(sfd, dfd, name, rel, &st)
	case unix.S_IFLNK:
		err = c.copySymlink(sfd, dfd, name, &st)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return nil // a device node: dropped (whiteouts are 0:0)
		}
		err = c.copyNode(sfd, dfd, name, &st)
	case unix.S_IFIFO:
		err = c.copyNode(sfd, dfd, name, &st)
	default:
		return nil // block devices and sockets: dropped
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

func (c *layerCopier) copySubdir(src, dst *os.File, name, rel string, st *unix.Stat_t, depth int) error {
	// 0700 until its attributes are set, after its contents.
	if err := unix.Mkdirat(int(dst.Fd()), name, 0o700); err != nil {
		return err
	}
	sub, err := openDirAt(src, name)
	if err != nil {
		return err
	}
	defer sub.Close()
	dsub, err := openDirAt(dst, name)
	if err != nil {
		return err
	}
	defer dsub.Close()
	if err := c.copyDir(sub, dsub, rel, depth+1); err != nil {
		return err
	}
	if err := c.setAttrs(int(sub.Fd()), int(dsub.Fd()), st); err != nil {
		return err
	}
	return unix.UtimesNanoAt(int(dst.Fd()), name, times(st), unix.AT_SYMLINK_NOFOLLOW)
}

func openDirAt(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

func (c *layerCopier) copyFile(sfd, dfd int, name, rel string, st *unix.Stat_t) error {
	id := fileID{st.Dev, st.Ino}
	if st.Nlink > 1 {
		if first, ok := c.links[id]; ok {
			return unix.Linkat(int(c.root.Fd()), first, dfd, name, 0)
		}
	}
	in, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	inf := os.NewFile(uintptr(in), name)
	defer inf.Close()
	out, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	outf := os.NewFile(uintptr(out), name)
	defer outf.Close()
	if err := copyExtents(inf, outf, st.Size); err != nil {
		return err
	}
	if err := c.setAttrs(in, out, st); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(dfd, name, times(st), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Nlink > 1 {
		c.links[id] = rel
	}
	return nil
}

func (c *layerCopier) copySymlink(sfd, dfd int, name string, st *unix.Stat_t) error {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(sfd, name, buf)
	if err != nil {
		return err
	}
	if err := unix.Symlinkat(string(buf[:n]), dfd, name); err != nil {
		return err
	}
	return c.setPathAttrs(sfd, dfd, name, st)
}

// copyNode makes a FIFO or a whiteout like src's entry name.
func (c *layerCopier) copyNode(sfd, dfd int, name string, st *unix.Stat_t) error {
	if err := unix.Mknodat(dfd, name, st.Mode&unix.S_IFMT|0o600, 0); err != nil {
		return err
	}
	return c.setPathAttrs(sfd, dfd, name, st)
}

// setAttrs gives out (an open file or directory) in's owner, mode and
// extended attributes. chown clears setuid, setgid and the capability
// xattr, so it goes first.
func (c *layerCopier) setAttrs(in, out int, st *unix.Stat_t) error {
	if err := unix.Fchown(out, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(out, st.Mode&0o7777); err != nil {
		return err
	}
	return copyXattrs(fdXattrs(in), fdXattrs(out))
}

// setPathAttrs is setAttrs for entries that cannot be opened (symbolic
// links, FIFOs and whiteouts, which open would block on or refuse), by
// name in their directories; it sets their times too. A symbolic link's
// mode means nothing.
func (c *layerCopier) setPathAttrs(sfd, dfd int, name string, st *unix.Stat_t) error {
	if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, name, st.Mode&0o7777, 0); err != nil {
			return err
		}
	}
	if err := copyXattrs(pathXattrs(fdPath(sfd, name)), pathXattrs(fdPath(dfd, name))); err != nil {
		return err
	}
	return unix.UtimesNanoAt(dfd, name, times(st), unix.AT_SYMLINK_NOFOLLOW)
}

// fdPath names the entry name of directory fd through /proc/self/fd, for
// the l*xattr calls, which take no directory descriptor: the directory is
// the one already open, and the last component is not followed.
func fdPath(fd int, name string) string { return fmt.Sprintf("/proc/self/fd/%d/%s", fd, name) }

// xattrOps reads and writes the extended attributes of one file: by
// descriptor, or by path without following a last symbolic link.
type xattrOps struct {
	list func(buf []byte) (int, error)
	get  func(name string, buf []byte) (int, error)
	set  func(name string, v []byte) error
}

func fdXattrs(fd int) xattrOps {
	return xattrOps{
		list: func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) },
		get:  func(n string, buf []byte) (int, error) { return unix.Fgetxattr(fd, n, buf) },
		set:  func(n string, v []byte) error { return unix.Fsetxattr(fd, n, v, 0) },
	}
}

func pathXattrs(p string) xattrOps {
	return xattrOps{
		list: func(buf []byte) (int, error) { return unix.Llistxattr(p, buf) },
		get:  func(n string, buf []byte) (int, error) { return unix.Lgetxattr(p, n, buf) },
		set:  func(n string, v []byte) error { return unix.Lsetxattr(p, n, v, 0) },
	}
}

// copyXattrs copies every extended attribute of src to dst.
func copyXattrs(src, dst xattrOps) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, n := range names {
		v, err := getXattr(src, n)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", n, err)
		}
		if err := dst.set(n, v); err != nil {
			return fmt.Errorf("setting %s: %w", n, err)
		}
	}
	return nil
}

func listXattrs(x xattrOps) ([]string, error) {
	for {
		size, err := x.list(nil)
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil || size == 0 {
			return nil, err
		}
		buf := make([]byte, size)
		size, err = x.list(buf)
		if errors.Is(err, syscall.ERANGE) {
			continue // grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for start, i := 0, 0; i < size; i++ {
			if buf[i] == 0 {
				if i > start {
					out = append(out, string(buf[start:i]))
				}
				start = i + 1
			}
		}
		return out, nil
	}
}

func getXattr(x xattrOps, name string) ([]byte, error) {
	for {
		size, err := x.get(name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size)
		n, err := x.get(name, buf)
		if errors.Is(err, syscall.ERANGE) {
			continue // grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// times are st's access and modification times, for utimensat.
func times(st *unix.Stat_t) []unix.Timespec {
	return []unix.Timespec{st.Atim, st.Mtim}
}
