package files

import (
	"bytes"
	"compress/gzip"
	"net/url"
	"os"
	"path/filepath"
	"testing"
)

// A body that ends early must fail the upload and leave no file behind,
// neither the destination nor a temporary file.
func TestTruncatedUploadLeavesNothing(t *testing.T) {
	srv, _ := newServer(t, "")
	dir := t.TempDir()
	dst := filepath.Join(dir, "t.bin")

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bytes.Repeat([]byte("abcdefgh"), 10000))
	zw.Close()
	cut := gz.Bytes()[:gz.Len()/2]
	r := do(t, "POST", srv.URL+"/files?path="+url.QueryEscape(dst), bytes.NewReader(cut), map[string]string{
		"Content-Type": "application/octet-stream", "Content-Encoding": "gzip",
	})
	if r.status != 400 {
		t.Errorf("truncated gzip: status %d %s", r.status, r.body)
	}

	body, ct := multipartBody(t, map[string][]byte{dst: bytes.Repeat([]byte("x"), 100000)})
	all, _ := readAll(body)
	r = do(t, "POST", srv.URL+"/files", bytes.NewReader(all[:len(all)/2]), map[string]string{"Content-Type": ct})
	if r.status != 400 {
		t.Errorf("truncated multipart: status %d %s", r.status, r.body)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

func readAll(r interface{ Read([]byte) (int, error) }) ([]byte, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(r)
	return b.Bytes(), err
}
