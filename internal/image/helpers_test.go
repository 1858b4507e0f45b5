package image

import (
	"testing"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// tinyStore is a temporary store with a one-file layer.
func tinyStore(t testing.TB) (*Store, string) {
	t.Helper()
	testenv.NeedRoot(t)
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	layer := s.LayerDir("l1")
	testenv.WriteTinyLayer(t, layer)
	return s, layer
}
