package filesystem

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

// MetadataXattrPrefix prefixes the extended attributes that carry a file's
// user metadata (set by uploads with X-Metadata-* headers).
const MetadataXattrPrefix = "user.e2b."

// EntryInfo describes the entry at path without following a final symlink,
// the way E2B's envd does (infra's shared filesystem.GetEntryInfo): mode is
// the permission bits only (0o755 for a directory, no type or setuid
// bits), permissions the lstat mode's string form ("drwxr-xr-x",
// "Lrwxrwxrwx"), owner and group are names (numeric when unknown),
// metadata the user.e2b.* xattrs. A symlink reports its final target:
// that target's type and permission bits, and symlinkTarget its resolved
// absolute path; a dangling or looping link has no type
// (FILE_TYPE_UNSPECIFIED), mode 0 and its own path as symlinkTarget.
// path is reported as given; callers pass absolute paths.
func EntryInfo(path string) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return entryFromInfo(path, fi), nil
}

// entryFromInfo builds the entry from an lstat result the caller already has
// (ListDir gets one from ReadDir for free).
func entryFromInfo(path string, fi fs.FileInfo) *pb.EntryInfo {
	mode := fi.Mode()
	e := &pb.EntryInfo{
		Name:        fi.Name(),
		Path:        path,
		Size:        fi.Size(),
		Mode:        uint32(mode.Perm()),
		Permissions: mode.String(),
		Type:        fileType(mode),
	}
	if !fi.ModTime().IsZero() {
		e.ModifiedTime = timestamppb.New(fi.ModTime())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = names.user(st.Uid)
		e.Group = names.group(st.Gid)
	}
	if mode&fs.ModeSymlink != 0 {
		target := symlinkTarget(path)
		e.SymlinkTarget = &target
		e.Type, e.Mode = pb.FileType_FILE_TYPE_UNSPECIFIED, 0
		if ti, err := os.Stat(target); err == nil {
			e.Type, e.Mode = fileType(ti.Mode()), uint32(ti.Mode().Perm())
		}
	} else {
		// Symlinks cannot carry user.* xattrs, so only real entries are asked.
		e.Metadata = readMetadata(path)
	}
	return e
}

func fileType(m fs.FileMode) pb.FileType {
	switch {
	case m&fs.ModeSymlink != 0:
		return pb.FileType_FILE_TYPE_SYMLINK
	case m.IsDir():
		return pb.FileType_FILE_TYPE_DIRECTORY
	case m.IsRegular():
		return pb.FileType_FILE_TYPE_FILE
	default:
		return pb.FileType_FILE_TYPE_UNSPECIFIED
	}
}

// symlinkTarget is where the link finally leads, as an absolute path (the
// whole chain resolved); a link that does not resolve (dangling, looping)
// names itself, as in E2B's envd.
func symlinkTarget(path string) string {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return path
	}
	if abs, err := filepath.Abs(resolved); err == nil {
		return abs
	}
	return resolved
}

// readMetadata returns the user.e2b.* xattrs of path with the prefix
// stripped, or nil when there are none or the filesystem has no xattrs.
// Metadata is decoration: any failure reading it leaves it out rather than
// failing the whole stat.
func readMetadata(path string) map[string]string {
	buf, err := xattrBytes(func(b []byte) (int, error) { return unix.Llistxattr(path, b) })
	if err != nil || len(buf) == 0 {
		return nil
	}
	var out map[string]string
	for _, name := range strings.Split(string(buf), "\x00") {
		key, ok := strings.CutPrefix(name, MetadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		val, err := xattrBytes(func(b []byte) (int, error) { return unix.Lgetxattr(path, name, b) })
		if err != nil {
			continue // removed meanwhile (ENODATA) or unreadable
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = string(val)
	}
	return out
}

// xattrBytes runs a size-query-then-read xattr call, retrying when the value
// grew between the two calls (ERANGE).
func xattrBytes(call func([]byte) (int, error)) ([]byte, error) {
	for range 3 {
		size, err := call(nil)
		if err != nil {
			return nil, err
		}
		if size == 0 {
			return nil, nil
		}
		buf := make([]byte, size)
		n, err := call(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	return nil, unix.ERANGE
}
