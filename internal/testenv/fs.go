package testenv

// File system checks shared by the tests of the packages that write
// layers (internal/oci, internal/rootfs).

import (
	"encoding/binary"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// CapV2 is a security.capability value (VFS_CAP_REVISION_2, effective)
// granting CAP_NET_RAW.
func CapV2() []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|1)
	binary.LittleEndian.PutUint32(b[4:], 1<<13)
	return b
}

// AssertWhiteout fails t unless p is an overlayfs whiteout.
func AssertWhiteout(t testing.TB, p string) {
	t.Helper()
	st := Lstat(t, p)
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("%s: mode %o rdev %d, want a whiteout (char device 0:0)", p, st.Mode, st.Rdev)
	}
}

// Lstat is p's own stat (not a link's target), or a fatal error.
func Lstat(t testing.TB, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// Xattr is p's extended attribute key (not a link's target).
func Xattr(t testing.TB, p, key string) string {
	t.Helper()
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, key, buf)
	if err != nil {
		t.Errorf("%s: getting %s: %v", p, key, err)
		return ""
	}
	return string(buf[:n])
}

// DirNames are the names in directory d.
func DirNames(t testing.TB, d string) []string {
	t.Helper()
	es, err := os.ReadDir(d)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
