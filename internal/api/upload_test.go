package api

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
)

// An upload over --max-upload-mb is refused with 413 and E2B's error
// body, and nothing of it is kept.
func TestUploadTooLargeIs413(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateTeam(ctx, store.Team{ID: "t1", Name: "t1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	images, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The builder never starts a sandbox here: a node it does not use.
	b, err := template.New(template.Config{Store: st, Images: images, Node: &node.Node{}, MaxUploadBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.Create(ctx, template.CreateRequest{TeamID: "t1", Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Config{Store: st, Templates: b}))
	defer srv.Close()
	_, url, err := b.FileStatus(ctx, "t1", c.Template.ID, "h1", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	content := strings.Repeat("x", 64<<10)
	_ = tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte(content))
	_ = tw.Close()
	req, err := http.NewRequest(http.MethodPut, url, bytes.NewReader(archive.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusRequestEntityTooLarge || body.Code != 413 || !strings.Contains(body.Message, "--max-upload-mb") {
		t.Errorf("got %d %+v, want 413 with E2B's body naming --max-upload-mb", res.StatusCode, body)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "uploads", c.Template.ID)); len(ents) != 0 {
		t.Errorf("%d files kept after a refused upload", len(ents))
	}
}
