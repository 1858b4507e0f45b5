package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/store"
)

// These tests need no root: uploads never touch a sandbox, so the
// builder gets a node it never uses.

func newUploadBuilder(t *testing.T, st store.Store, dataDir string, options ...func(*Config)) *Builder {
	t.Helper()
	images, err := image.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Store: st, Images: images, Node: &node.Node{}}
	for _, o := range options {
		o(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tarOf is a tar archive of files (name → content).
func tarOf(t testing.TB, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// upload does what the SDK does: asks for the URL, then PUTs to it.
func upload(t testing.TB, b *Builder, teamID, templateID, hash string, body []byte) error {
	t.Helper()
	_, u, err := b.FileStatus(context.Background(), teamID, templateID, hash, "http://api.test")
	if err != nil {
		t.Fatal(err)
	}
	return uploadTo(t, b, u, body)
}

// uploadTo PUTs body to an upload URL.
func uploadTo(t testing.TB, b *Builder, rawURL string, body []byte) error {
	t.Helper()
	pu, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	rest, ok := strings.CutPrefix(pu.Path, UploadPathPrefix)
	if !ok {
		t.Fatalf("upload URL %s", rawURL)
	}
	templateID, hash, _ := strings.Cut(rest, "/files/")
	q := pu.Query()
	return b.Upload(context.Background(), templateID, hash, q.Get("expires"), q.Get("signature"), bytes.NewReader(body))
}

func newTemplate(t testing.TB, b *Builder, teamID, name string) Created {
	t.Helper()
	c, err := b.Create(context.Background(), CreateRequest{TeamID: teamID, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// uploadFiles lists what a template's upload dir holds, temporary files
// included.
func uploadFiles(t testing.TB, b *Builder, templateID string) []string {
	t.Helper()
	ents, err := os.ReadDir(b.uploadDir(templateID))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestUploadURLSurvivesRestart(t *testing.T) {
	st, dir := newStore(t), t.TempDir()
	b1 := newUploadBuilder(t, st, dir)
	c := newTemplate(t, b1, "t1", "app")
	_, u, err := b1.FileStatus(context.Background(), "t1", c.Template.ID, "h1", "http://api.test")
	if err != nil {
		t.Fatal(err)
	}
	// warren restarts: the URL it handed out still works.
	b2 := newUploadBuilder(t, st, dir)
	if err := uploadTo(t, b2, u, tarOf(t, map[string]string{"a": "a"})); err != nil {
		t.Fatalf("a URL signed before the restart: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dir, uploadKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the signing key's mode is %o, want 0600", fi.Mode().Perm())
	}
	// A signature made with another key is refused.
	other := newUploadBuilder(t, st, t.TempDir())
	_, bad, err := other.FileStatus(context.Background(), "t1", c.Template.ID, "h1", "http://api.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := uploadTo(t, b2, bad, tarOf(t, map[string]string{"a": "a"})); !errors.Is(err, ErrForbidden) {
		t.Errorf("a URL signed with another key: err = %v, want ErrForbidden", err)
	}
}

func TestUploadIsCappedWhileItStreams(t *testing.T) {
	b := newUploadBuilder(t, newStore(t), t.TempDir(), func(c *Config) { c.MaxUploadBytes = 8 << 10 })
	c := newTemplate(t, b, "t1", "app")
	big := tarOf(t, map[string]string{"big": strings.Repeat("x", 16<<10)})
	err := upload(t, b, "t1", c.Template.ID, "big", big)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("an upload over the limit: err = %v, want ErrTooLarge", err)
	}
	if !strings.Contains(err.Error(), "8192") {
		t.Errorf("the error does not say the limit: %v", err)
	}
	if files := uploadFiles(t, b, c.Template.ID); len(files) != 0 {
		t.Errorf("left after a refused upload: %v", files)
	}
	// The stream is not read much past the limit.
	r := &countingBody{r: bytes.NewReader(big)}
	_, u, _ := b.FileStatus(context.Background(), "t1", c.Template.ID, "big", "http://api.test")
	pu, _ := url.Parse(u)
	_ = b.Upload(context.Background(), c.Template.ID, "big", pu.Query().Get("expires"), pu.Query().Get("signature"), r)
	if r.n > 9<<10 {
		t.Errorf("read %d bytes of an upload capped at 8 KiB", r.n)
	}
	small := tarOf(t, map[string]string{"small": "ok"})
	if err := upload(t, b, "t1", c.Template.ID, "small", small); err != nil {
		t.Fatalf("an upload under the limit: %v", err)
	}
}

type countingBody struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestTemplateUploadsAreBounded(t *testing.T) {
	b := newUploadBuilder(t, newStore(t), t.TempDir(), func(c *Config) {
		c.MaxTemplateUploads = 2
		c.MaxTemplateUploadBytes = 1 << 20
	})
	c := newTemplate(t, b, "t1", "app")
	archive := func(s string) []byte { return tarOf(t, map[string]string{"f": s}) }
	for _, h := range []string{"h1", "h2"} {
		if err := upload(t, b, "t1", c.Template.ID, h, archive(h)); err != nil {
			t.Fatal(err)
		}
	}
	if err := upload(t, b, "t1", c.Template.ID, "h3", archive("h3")); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a third archive with a limit of two: err = %v, want ErrTooLarge", err)
	}
	// Replacing one it has is no more.
	if err := upload(t, b, "t1", c.Template.ID, "h2", archive("h2 again")); err != nil {
		t.Errorf("replacing an archive: %v", err)
	}
	// Bytes: 1 MiB in all.
	c2 := newTemplate(t, b, "t1", "bytes")
	half := tarOf(t, map[string]string{"f": strings.Repeat("y", 600<<10)})
	if err := upload(t, b, "t1", c2.Template.ID, "a", half); err != nil {
		t.Fatal(err)
	}
	if err := upload(t, b, "t1", c2.Template.ID, "b", half); !errors.Is(err, ErrTooLarge) {
		t.Errorf("1.2 MiB kept with a limit of 1 MiB: err = %v, want ErrTooLarge", err)
	}
	if files := uploadFiles(t, b, c2.Template.ID); len(files) != 1 || files[0] != "a" {
		t.Errorf("kept %v, want [a]", files)
	}
	// Another template has a budget of its own.
	c3 := newTemplate(t, b, "t1", "other")
	if err := upload(t, b, "t1", c3.Template.ID, "a", half); err != nil {
		t.Error(err)
	}
}

func TestPruneUploadsKeepsWhatBuildsUse(t *testing.T) {
	st := newStore(t)
	b := newUploadBuilder(t, st, t.TempDir())
	ctx := context.Background()
	c := newTemplate(t, b, "t1", "app")
	old := time.Now().Add(-time.Hour)
	for _, h := range []string{"old", "used", "pending"} {
		if err := upload(t, b, "t1", c.Template.ID, h, tarOf(t, map[string]string{"f": h})); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(b.uploadPath(c.Template.ID, h), old, old); err != nil {
			t.Fatal(err)
		}
	}
	copyOf := func(hash string) *buildspec.Spec {
		return &buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{{Type: "COPY", Args: []string{".", "/app"}, FilesHash: hash}}}
	}
	// The build that ends used "used"; another one, started, uses
	// "pending"; a third is not started yet, and what was uploaded since
	// it was made ("fresh") may be its.
	finished := buildRecord{Tags: []string{"default"}, Spec: copyOf("used")}
	if _, err := st.UpdateBuild(ctx, c.BuildID, func(bd *store.Build) error {
		bd.Spec, bd.Status = finished.String(), store.BuildReady
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.newBuild(ctx, c.Template, buildRecord{Tags: []string{"default"}, Spec: copyOf("pending")}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.newBuild(ctx, c.Template, buildRecord{Tags: []string{"default"}}); err != nil {
		t.Fatal(err)
	}
	if err := upload(t, b, "t1", c.Template.ID, "fresh", tarOf(t, map[string]string{"f": "fresh"})); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(b.uploadPath(c.Template.ID, "fresh"), later, later); err != nil {
		t.Fatal(err)
	}
	b.pruneUploads(ctx, c.Template.ID, *finished.Spec)
	if files := uploadFiles(t, b, c.Template.ID); strings.Join(files, ",") != "fresh,pending,used" {
		t.Errorf("after a ready build: %v, want [fresh pending used]", files)
	}
}

func TestStartRemovesPartialUploads(t *testing.T) {
	st, dir := newStore(t), t.TempDir()
	b := newUploadBuilder(t, st, dir)
	c := newTemplate(t, b, "t1", "app")
	if err := upload(t, b, "t1", c.Template.ID, "kept", tarOf(t, map[string]string{"f": "f"})); err != nil {
		t.Fatal(err)
	}
	partial := filepath.Join(b.uploadDir(c.Template.ID), ".tmp-123")
	if err := os.WriteFile(partial, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := newUploadBuilder(t, st, dir).Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if files := uploadFiles(t, b, c.Template.ID); strings.Join(files, ",") != "kept" {
		t.Errorf("after a restart: %v, want [kept]", files)
	}
}
