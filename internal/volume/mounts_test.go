package volume

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestCheckMountPaths(t *testing.T) {
	good := [][]string{
		{"/data"}, {"/home/user/data", "/mnt/a", "/mnt/b"}, {"/tmp"}, {"/tmp/x"}, {"/opt/app"},
		{"/etc/app"}, {"/data", "/data2"}, {"/process"}, {"/devices"},
	}
	for _, paths := range good {
		if err := CheckMountPaths(paths); err != nil {
			t.Errorf("CheckMountPaths(%q): %v", paths, err)
		}
	}
	bad := [][]string{
		{""}, {"data"}, {"./data"}, {"/"}, {"/data/"}, {"/data/../etc"}, {"/a//b"}, {"/a/./b"},
		{"/proc"}, {"/proc/self"}, {"/sys"}, {"/sys/fs/cgroup"}, {"/dev"}, {"/dev/shm"},
		{"/opt"}, {"/opt/warren"}, {"/opt/warren/envd"}, {"/opt/warren/envd/x"},
		{"/etc"}, {"/etc/resolv.conf"}, {"/etc/hosts"},
		{"/data", "/data"}, {"/data", "/data/sub"}, {"/a/b", "/a"},
		{"/a\x00b"}, {"/" + strings.Repeat("a", 2000)},
	}
	for _, paths := range bad {
		if err := CheckMountPaths(paths); !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckMountPaths(%q) accepted", paths)
		}
	}
	var many []string
	for i := 0; i <= MaxMounts; i++ {
		many = append(many, fmt.Sprintf("/m%d", i))
	}
	if err := CheckMountPaths(many); !errors.Is(err, ErrInvalid) {
		t.Errorf("%d mounts accepted", len(many))
	}
}

func FuzzCheckMountPaths(f *testing.F) {
	for _, s := range []string{"/data", "/proc/x", "/opt/warren", "/a\n/a/b", "/x\n/x", "..", "/etc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, joined string) {
		paths := strings.Split(joined, "\n")
		if CheckMountPaths(paths) != nil {
			return
		}
		for i, p := range paths {
			for _, r := range append(reservedTrees, "/") {
				if p == r || strings.HasPrefix(p, r+"/") && r != "/" {
					t.Errorf("accepted %q under %s", p, r)
				}
			}
			if !strings.HasPrefix(p, "/") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
				t.Errorf("accepted %q", p)
			}
			for j := 0; j < i; j++ {
				if p == paths[j] || strings.HasPrefix(p, paths[j]+"/") || strings.HasPrefix(paths[j], p+"/") {
					t.Errorf("accepted overlapping %q and %q", p, paths[j])
				}
			}
		}
	})
}
