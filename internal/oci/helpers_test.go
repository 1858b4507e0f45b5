package oci

import (
	"errors"
	"os"
	"testing"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// tempStore is an image store in a temporary dir.
func tempStore(t testing.TB) *image.Store {
	t.Helper()
	testenv.NeedRoot(t)
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// assertUnmounted checks that nothing is mounted at or below a
// sandbox's dir and that the dir is gone.
func assertUnmounted(t testing.TB, dir string) {
	t.Helper()
	if m, err := mountinfo.Below(dir); err != nil || len(m) > 0 {
		t.Errorf("mounts left: %v %v", m, err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s left (%v)", dir, err)
	}
}
