// Package layertar unpacks a container image layer (a tar stream) into a
// directory that overlayfs can use as a lower layer.
//
// The OCI whiteouts in a layer tar become overlayfs ones: ".wh.NAME"
// becomes a character device 0:0 called NAME, and ".wh..wh..opq" marks its
// directory opaque with the xattr trusted.overlay.opaque=y. This is what
// containerd's and Docker's overlay snapshotters do, and it needs root
// (mknod, trusted.* xattrs, chown).
//
// A layer tar is untrusted input. Device nodes are left out (a sandbox's
// /dev is a tmpfs of the runtime's, and a block device in a layer under
// the data dir would give the host's disk to whoever can open it); a
// character device 0:0 is kept, as it is an overlayfs whiteout. Setuid
// and setgid bits are kept (sudo needs them): the data dir is 0700, so no
// other local user can run what a layer holds. Entry names that are
// absolute or climb out with ".." are refused, and nothing is ever written through a
// symbolic link: every parent directory of an entry is checked, with
// lstat, to be a real directory inside the layer before the entry is
// created, so a tar holding "a -> /etc" and then "a/passwd" fails instead
// of writing the host's /etc/passwd. The checks cannot be raced: the
// layer's root stays mode 0700 until the end, so no other user can reach
// into the tree meanwhile (a world-writable directory such as tmp/ inside
// it would otherwise let anyone swap a directory for a symlink between the
// check and the write). Hard links must point inside the same layer, and
// only the security.capability xattr is taken from the tar: others, such
// as trusted.overlay.*, could change how overlayfs reads the layer. Sparse
// entries are refused (see isSparse).
//
// Where the directory comes from, and what makes the result a layer
// (hashing, renaming into place), is the caller's: internal/oci.
package layertar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Overlayfs' names for OCI whiteouts (see the package documentation).
const (
	whiteoutPrefix   = ".wh."
	whiteoutMeta     = ".wh..wh."     // AUFS bookkeeping, not a whiteout
	whiteoutOpaque   = ".wh..wh..opq" // the directory hides lower layers' contents
	opaqueXattr      = "trusted.overlay.opaque"
	capabilityXattr  = "security.capability"
	capabilityPAXKey = "SCHILY.xattr." + capabilityXattr
)

// Writer writes a layer tar's entries into root, a new private
// directory (mode 0700, made by the caller), one Entry at a time; Finish
// sets the directories' times and then the root's own attributes. Every write goes to a path whose parents were checked (by
// dir) to be real directories inside root.
type Writer struct {
	root string
	buf  []byte
	// checked is a directory (relative to root) known to be a real
	// directory chain: entries usually come directory by directory, so
	// this saves most of the lstats. Anything removed resets it.
	checked string
	// dirs are directories whose times are set at the end, once nothing
	// more is created in them.
	dirs    []*tar.Header
	rootHdr *tar.Header
	// droppedDevices are the device nodes left out, by name.
	droppedDevices []string
}

// NewWriter returns a writer of the layer at root.
func NewWriter(root string) *Writer {
	return &Writer{root: root, buf: make([]byte, 256<<10)}
}

// DroppedDevices are the device nodes left out so far, by name relative
// to the layer's root.
func (w *Writer) DroppedDevices() []string { return w.droppedDevices }

// Entry writes one entry of the tar; r is its content.
func (w *Writer) Entry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // archive-wide PAX records, already applied by archive/tar
	}
	rel, err := entryPath(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("the layer's root must be a directory")
		}
		h := *hdr
		w.rootHdr = &h
		return nil
	}
	parent, base := path.Split(rel)
	parent = strings.TrimSuffix(parent, "/")
	if err := w.dir(parent, true); err != nil {
		return err
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		return w.whiteout(hdr, parent, base)
	}
	p := filepath.Join(w.root, rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		// A directory that replaces this layer's whiteout of the same
		// name was deleted and made anew: it must hide what lower
		// layers had in it, and overlayfs cannot express both a
		// whiteout and a directory, but an opaque directory does that.
		replacesWhiteout := IsWhiteout(p)
		kept, err := w.clear(p, true)
		if err != nil {
			return err
		}
		if !kept {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
		}
		if replacesWhiteout {
			if err := unix.Lsetxattr(p, opaqueXattr, []byte("y"), 0); err != nil {
				return err
			}
		}
		if err := w.owner(p, hdr); err != nil {
			return err
		}
		h := *hdr
		w.dirs = append(w.dirs, &h)
		return unix.Chmod(p, uint32(hdr.Mode&0o7777))
	case tar.TypeReg, tar.TypeRegA:
		if isSparse(hdr) {
			return errors.New("sparse file entries are not supported")
		}
		if _, err := w.clear(p, false); err != nil {
			return err
		}
		return w.file(p, hdr, r)
	case tar.TypeSymlink:
		if _, err := w.clear(p, false); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
		if err := w.owner(p, hdr); err != nil {
			return err
		}
		return setTimes(p, hdr)
	case tar.TypeLink:
		return w.hardlink(p, parent, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if _, err := w.clear(p, false); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeFifo && !(hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0) {
			// A device node: left out (see the package documentation).
			w.droppedDevices = append(w.droppedDevices, rel)
			return nil
		}
		mode := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		if err := unix.Mknod(p, mode|0o600, 0); err != nil {
			return err
		}
		if err := w.owner(p, hdr); err != nil {
			return err
		}
		// mknod's mode is masked by the umask; chmod is not.
		if err := unix.Chmod(p, uint32(hdr.Mode&0o7777)); err != nil {
			return err
		}
		return setTimes(p, hdr)
	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
}

// isSparse tells whether hdr is a regular file in one of GNU tar's sparse
// formats (PAX 0.x and 1.0; the old GNU format has its own type, which
// entry refuses as unknown). archive/tar reads a sparse file's holes back
// as zeros, and a header of a few bytes can declare any size: a tiny layer
// would write terabytes. Container tools do not write them.
func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// entryPath is an entry's name relative to the layer's root, "." for the
// root itself. Absolute names and names that climb out with ".." are
// refused: a layer has no business there.
func entryPath(n string) (string, error) {
	if n == "" {
		return "", errors.New("empty entry name")
	}
	if strings.HasPrefix(n, "/") {
		return "", errors.New("absolute entry name")
	}
	c := path.Clean(n)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", errors.New("entry name escapes the layer")
	}
	return c, nil
}

// dir makes sure rel ("" or "." for the root) is a real directory inside
// root: no component may be a symbolic link or anything but a directory.
// Missing components are created (mode 0755, like Docker does for a tar
// that lists a file before its directory) if create is set, else an error.
func (w *Writer) dir(rel string, create bool) error {
	if rel == "" || rel == "." || rel == w.checked {
		return nil
	}
	cur := w.root
	for _, c := range strings.Split(rel, "/") {
		cur = filepath.Join(cur, c)
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := os.Mkdir(cur, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%s is a symbolic link: refusing to write through it", strings.TrimPrefix(cur, w.root+"/"))
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory", strings.TrimPrefix(cur, w.root+"/"))
		}
	}
	w.checked = rel
	return nil
}

// clear makes way for a new entry at p, whose parent is checked: an
// earlier entry of the same name is removed, unless both are directories,
// which merge (kept is then true), as when tar extracts over a tree.
func (w *Writer) clear(p string, dir bool) (kept bool, _ error) {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if dir && fi.IsDir() {
		return true, nil
	}
	w.checked = "" // p may have been part of it
	return false, os.RemoveAll(p)
}

// FileFiller is an entry's content that writes itself into the new
// regular file (Entry's r for a file that is not a plain stream of its
// bytes: internal/imagepeer's sparse files, whose holes it leaves
// unwritten). It writes only into f.
type FileFiller interface {
	FillFile(f *os.File) error
}

// file writes a regular file. Ownership is set before the mode, since
// chown clears setuid and setgid bits, and before the capability xattr,
// which chown clears too.
func (w *Writer) file(p string, hdr *tar.Header, r io.Reader) error {
	// O_EXCL: p was cleared, so this creates the file and never opens
	// something that appeared meanwhile, nor follows a symlink.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if ff, ok := r.(FileFiller); ok {
		err = ff.FillFile(f)
	} else {
		_, err = io.CopyBuffer(f, r, w.buf)
	}
	if err != nil {
		return err
	}
	fd := int(f.Fd())
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return err
	}
	if v, ok := hdr.PAXRecords[capabilityPAXKey]; ok {
		if err := unix.Fsetxattr(fd, capabilityXattr, []byte(v), 0); err != nil {
			return fmt.Errorf("setting %s: %w", capabilityXattr, err)
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return setTimes(p, hdr)
}

// hardlink links p to an earlier entry of the same layer.
func (w *Writer) hardlink(p, parent string, hdr *tar.Header) error {
	target, err := entryPath(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if target == "." {
		return errors.New("hard link to the layer's root")
	}
	if slices.Contains(w.droppedDevices, target) {
		w.droppedDevices = append(w.droppedDevices, strings.TrimPrefix(p, w.root+"/"))
		return nil // a link to a device node that was left out
	}
	tp := filepath.Join(w.root, target)
	if tp == p {
		return errors.New("hard link to itself")
	}
	// The target's own parents must be real directories too, or the link
	// could reach a file outside the layer through a symlink.
	if err := w.dir(path.Dir(target), false); err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	fi, err := os.Lstat(tp)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("hard link target %q is a directory", hdr.Linkname)
	}
	// Checking the target's parents may have moved w.checked; check p's
	// again (cheap when it was the same directory).
	if err := w.dir(parent, true); err != nil {
		return err
	}
	if _, err := w.clear(p, false); err != nil {
		return err
	}
	// link(2) does not follow a symlink at tp: it links the symlink.
	return os.Link(tp, p)
}

// whiteout turns an OCI whiteout entry into overlayfs' form. A whiteout
// hides lower layers' files only, never its own layer's (OCI image spec,
// "Whiteouts"): if this layer already has the name, a directory is made
// opaque instead and anything else left as it is, since it hides lower
// layers' file already.
func (w *Writer) whiteout(hdr *tar.Header, parent, base string) error {
	if base == whiteoutOpaque {
		return unix.Lsetxattr(filepath.Join(w.root, parent), opaqueXattr, []byte("y"), 0)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	hidden := strings.TrimPrefix(base, whiteoutPrefix)
	if hidden == "" || hidden == "." || hidden == ".." {
		return fmt.Errorf("invalid whiteout %q", base)
	}
	p := filepath.Join(w.root, parent, hidden)
	fi, err := os.Lstat(p)
	switch {
	case err == nil && fi.IsDir():
		return unix.Lsetxattr(p, opaqueXattr, []byte("y"), 0)
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := unix.Mknod(p, unix.S_IFCHR, int(unix.Mkdev(0, 0))); err != nil {
		return fmt.Errorf("making whiteout %s: %w", hidden, err)
	}
	return w.owner(p, hdr)
}

// IsWhiteout tells whether p is an overlayfs whiteout: a character
// device 0:0.
func IsWhiteout(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// owner sets p's owner (p's own, not a symlink's target).
func (w *Writer) owner(p string, hdr *tar.Header) error {
	return unix.Lchown(p, hdr.Uid, hdr.Gid)
}

// Finish sets directories' times, now that nothing more is created in
// them, and then the root's attributes, which opens it to other users.
func (w *Writer) Finish() error {
	for _, hdr := range w.dirs {
		rel, _ := entryPath(hdr.Name)
		// A later entry may have replaced the directory, or one of its
		// parents, with something else: check again.
		if err := w.dir(path.Dir(rel), false); err != nil {
			continue
		}
		p := filepath.Join(w.root, rel)
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			continue
		}
		if err := setTimes(p, hdr); err != nil {
			return err
		}
	}
	root := w.rootHdr
	if root == nil {
		now := time.Now()
		root = &tar.Header{Mode: 0o755, ModTime: now, AccessTime: now}
	}
	if err := w.owner(w.root, root); err != nil {
		return err
	}
	if err := unix.Chmod(w.root, uint32(root.Mode&0o7777)); err != nil {
		return err
	}
	return setTimes(w.root, root)
}

// setTimes sets p's access and modification times from hdr, on p itself
// if it is a symlink.
func setTimes(p string, hdr *tar.Header) error {
	mtime := hdr.ModTime
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{
		{Sec: atime.Unix(), Nsec: int64(atime.Nanosecond())},
		{Sec: mtime.Unix(), Nsec: int64(mtime.Nanosecond())},
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}
