package files

import (
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A full disk answers 507 (the SDK's NotEnoughSpaceError) and leaves no
// partial file. It needs a small tmpfs, so it runs only where root may mount.
func TestNoSpaceIs507(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	srv, _ := newServer(t, "")
	dst := filepath.Join(dir, "big")
	r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(dst), bytes.NewReader(make([]byte, 1<<20)),
		map[string]string{"Content-Type": "application/octet-stream"})
	if r.status != 507 || errorCode(t, r) != 507 {
		t.Errorf("status %d %s", r.status, r.body)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}
