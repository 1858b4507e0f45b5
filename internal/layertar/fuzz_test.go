package layertar

import (
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzEntryPath: whatever a tar entry is called, entryPath either
// refuses it or names a path inside the layer.
func FuzzEntryPath(f *testing.F) {
	for _, s := range []string{"", ".", "./", "/", "a", "a/b/", "../x", "a/../../x", "/etc/passwd", "./../x", "a/./b",
		"..", "...", "a/..", "a//b", "\x00", "a/\x00/b", "..\\x", strings.Repeat("../", 100) + "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		rel, err := entryPath(name)
		if err != nil {
			return
		}
		if rel == "" || path.IsAbs(rel) || rel != path.Clean(rel) {
			t.Fatalf("entryPath(%q) = %q: not a clean relative path", name, rel)
		}
		if rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("entryPath(%q) = %q climbs out", name, rel)
		}
		root := "/layer/root"
		if p := filepath.Join(root, rel); p != root && !strings.HasPrefix(p, root+"/") {
			t.Fatalf("entryPath(%q) = %q lands at %s, outside %s", name, rel, p, root)
		}
	})
}
