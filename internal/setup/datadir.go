package setup

import (
	"fmt"
	"os"
	"syscall"
)

// DataDirMode is the data directory's mode. Nothing below it is for other
// local users: it holds tenants' layers (setuid programs a tenant made,
// device nodes of imported images), their uploads, sandboxes' root
// filesystems and disks, checkpoint images with their memory, the
// database and the credentials. 0700 stops every path below at the door,
// whatever the modes inside are.
const DataDirMode os.FileMode = 0o700

// SecureDataDir makes dir Warren's data directory: created with
// DataDirMode if missing; if it exists, owned by this process's user and
// with exactly DataDirMode, changing it if not. It reports what it changed
// ("" for nothing), for the caller to log. A symbolic link to a directory
// is followed: the target is what gets secured.
func SecureDataDir(dir string) (changed string, err error) {
	if err := os.MkdirAll(dir, DataDirMode); err != nil {
		return "", fmt.Errorf("setup: data dir: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("setup: data dir: %w", err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("setup: data dir %s is not a directory", dir)
	}
	st := fi.Sys().(*syscall.Stat_t)
	uid, gid := os.Geteuid(), os.Getegid()
	if int(st.Uid) != uid || int(st.Gid) != gid {
		// Another owner could rename anything below it.
		if err := os.Chown(dir, uid, gid); err != nil {
			return "", fmt.Errorf("setup: data dir: %w", err)
		}
		changed = fmt.Sprintf("owner %d:%d -> %d:%d", st.Uid, st.Gid, uid, gid)
	}
	// fi.Mode() without the type: permissions and setuid/setgid/sticky.
	if mode := fi.Mode() &^ os.ModeType; mode != DataDirMode {
		if err := os.Chmod(dir, DataDirMode); err != nil {
			return "", fmt.Errorf("setup: data dir: %w", err)
		}
		if changed != "" {
			changed += ", "
		}
		changed += fmt.Sprintf("mode %v -> %v", mode, DataDirMode)
	}
	return changed, nil
}
