package template

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// code-interpreter-v1 is built-in: before `warren setup` has built it a
// create of it is a 503-class error (not "not found", not a hang), no
// team may take its name, and once built every team resolves it.
func TestCodeInterpreterTemplateIsBuiltIn(t *testing.T) {
	st := newStore(t)
	dir := t.TempDir()
	b := newUploadBuilder(t, st, dir)
	ctx := context.Background()

	_, err := b.SandboxTemplate(ctx, "t1", baseimage.CodeInterpreterID)
	if !errors.Is(err, sandbox.ErrNodeUnavailable) {
		t.Fatalf("before it is built: %v, want ErrNodeUnavailable (503)", err)
	}
	if _, err := b.Create(ctx, CreateRequest{TeamID: "t1", Name: baseimage.CodeInterpreterID}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a team's template named %s: %v, want ErrConflict", baseimage.CodeInterpreterID, err)
	}

	images, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(images.LayerDir("ci-layer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := images.PutTemplate(&image.Template{ID: baseimage.CodeInterpreterID, Layers: []string{"ci-layer"}}); err != nil {
		t.Fatal(err)
	}
	for _, team := range []string{"t1", "t2"} {
		got, err := b.SandboxTemplate(ctx, team, baseimage.CodeInterpreterID)
		if err != nil || got.ID != baseimage.CodeInterpreterID || got.Image == nil {
			t.Fatalf("team %s, once built: %+v, %v", team, got, err)
		}
		// E2B's template has 2048 MB; the kernels need it.
		if got.MemoryMB != baseimage.CodeInterpreterMemoryMB {
			t.Errorf("team %s: %d MB, want %d", team, got.MemoryMB, baseimage.CodeInterpreterMemoryMB)
		}
	}
}

// While a background build makes code-interpreter-v1 (Config.Pending), a
// create of it is told so, still as a 503; base is none of its business.
func TestCodeInterpreterPendingBuild(t *testing.T) {
	st := newStore(t)
	why := ""
	b := newUploadBuilder(t, st, t.TempDir(), func(c *Config) {
		c.Pending = func(name string) string {
			if name == baseimage.CodeInterpreterID {
				return why
			}
			return ""
		}
	})
	ctx := context.Background()
	for _, w := range []string{"", "the code-interpreter-v1 template is being built on this node (for 3s so far)"} {
		why = w
		_, err := b.SandboxTemplate(ctx, "t1", baseimage.CodeInterpreterID)
		if !errors.Is(err, sandbox.ErrNodeUnavailable) {
			t.Fatalf("pending %q: %v, want ErrNodeUnavailable (503)", w, err)
		}
		want := w
		if want == "" {
			want = "is not built on this node yet"
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("pending %q: the error says %q", w, err)
		}
	}
}
