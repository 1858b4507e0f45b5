package filesystem

import (
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/warren-sandbox/warren/proto/envd/filesystem"
)

// MetadataXattrPrefix prefixes the extended attributes that carry a file's
// user metadata (set by uploads with X-Metadata-* headers).
const MetadataXattrPrefix = "user.e2b."

// EntryInfo describes the file at path (not following a final symlink) the
// way E2B's envd does: mode is the Go os.FileMode, permissions its string
// form, owner and group are names.
func EntryInfo(path string) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return entryFromInfo(path, fi), nil
}

func entryFromInfo(path string, fi fs.FileInfo) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name:        fi.Name(),
		Path:        path,
		Size:        fi.Size(),
		Mode:        uint32(fi.Mode()),
		Permissions: fi.Mode().String(),
		Type:        fileType(fi.Mode()),
	}
	if !fi.ModTime().IsZero() {
		e.ModifiedTime = timestamppb.New(fi.ModTime())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = names.user(st.Uid)
		e.Group = names.group(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if target, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(path), target)
			}
			e.SymlinkTarget = &target
		}
	} else {
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

// readMetadata returns the user.e2b.* xattrs of path, prefix stripped, or
// nil when there are none or the filesystem has no xattrs.
func readMetadata(path string) map[string]string {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size == 0 {
		return nil
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil
	}
	var out map[string]string
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		key, ok := strings.CutPrefix(name, MetadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		val := make([]byte, 4096)
		n, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = string(val[:n])
	}
	return out
}

// names caches uid/gid → name lookups; /etc/passwd rarely changes while a
// listing runs, and ListDir would otherwise parse it once per entry.
var names = &nameCache{users: map[uint32]string{}, groups: map[uint32]string{}}

type nameCache struct {
	mu     sync.Mutex
	users  map[uint32]string
	groups map[uint32]string
}

func (c *nameCache) user(uid uint32) string {
	return c.lookup(c.users, uid, func(id string) (string, error) {
		u, err := user.LookupId(id)
		if err != nil {
			return "", err
		}
		return u.Username, nil
	})
}

func (c *nameCache) group(gid uint32) string {
	return c.lookup(c.groups, gid, func(id string) (string, error) {
		g, err := user.LookupGroupId(id)
		if err != nil {
			return "", err
		}
		return g.Name, nil
	})
}

func (c *nameCache) lookup(m map[uint32]string, id uint32, find func(string) (string, error)) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if name, ok := m[id]; ok {
		return name
	}
	s := strconv.FormatUint(uint64(id), 10)
	name, err := find(s)
	if err != nil {
		// Shown as a number, and not cached: the account may be created later.
		return s
	}
	m[id] = name
	return name
}
