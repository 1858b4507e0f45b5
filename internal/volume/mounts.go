package volume

import (
	"fmt"
	"path"
	"strings"
)

// MaxMounts bounds the volumes one sandbox mounts.
const MaxMounts = 16

// maxMountPath bounds a mount path's length.
const maxMountPath = 1024

// reserved are the sandbox paths a volume may not be mounted at, over or
// under: the kernel's file systems, and what the runtime mounts for envd
// (its binary, and the resolver and hosts files it gives every sandbox).
// A mount at an ancestor of envd's binary would hide it.
var (
	reservedTrees = []string{"/proc", "/sys", "/dev"}
	reservedFiles = []string{"/opt/warren/envd", "/etc/resolv.conf", "/etc/hosts"}
)

// CheckMountPaths checks where a sandbox's volumes would be mounted:
// absolute, clean paths ("." and ".." are refused, not resolved), not "/",
// not under /proc, /sys or /dev, not over envd or the files the runtime
// puts in every sandbox, none twice and none inside another, at most
// MaxMounts.
func CheckMountPaths(paths []string) error {
	if len(paths) > MaxMounts {
		return invalidf("%d volume mounts, at most %d", len(paths), MaxMounts)
	}
	for i, p := range paths {
		if err := checkMountPath(p); err != nil {
			return invalidf("volume mount #%d: %v", i, err)
		}
		for j := 0; j < i; j++ {
			q := paths[j]
			switch {
			case p == q:
				return invalidf("volume mount #%d: path %q is already used by mount #%d", i, p, j)
			case within(p, q) || within(q, p):
				return invalidf("volume mount #%d: path %q and mount #%d's %q are inside one another", i, p, j, q)
			}
		}
	}
	return nil
}

func checkMountPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("the path is empty")
	case len(p) > maxMountPath:
		return fmt.Errorf("the path is longer than %d bytes", maxMountPath)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("the path %q holds a NUL byte", p)
	case !path.IsAbs(p):
		return fmt.Errorf("the path %q is not absolute", p)
	case path.Clean(p) != p:
		return fmt.Errorf("the path %q is not clean: no '.', '..', '//' or trailing '/'", p)
	case p == "/":
		return fmt.Errorf("a volume cannot be mounted at /")
	}
	for _, r := range reservedTrees {
		if p == r || within(p, r) {
			return fmt.Errorf("the path %q is in %s, which the sandbox's kernel provides", p, r)
		}
	}
	for _, r := range reservedFiles {
		if p == r || within(p, r) || within(r, p) {
			return fmt.Errorf("the path %q would cover %s, which every sandbox needs", p, r)
		}
	}
	return nil
}

// within reports whether p is strictly below dir.
func within(p, dir string) bool { return strings.HasPrefix(p, dir+"/") }

// invalidError is a request's mistake: it matches ErrInvalid, and its
// message is the mistake alone (a caller adds its own prefix).
type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}
