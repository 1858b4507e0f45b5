package baseimage

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/warren-sandbox/warren/internal/image"
)

// TestEnsureMCPGateway builds the template on a stand-in base: one layer
// with the gateway, rebuilt when the binary changes and not otherwise.
func TestEnsureMCPGateway(t *testing.T) {
	dir := t.TempDir()
	s, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.LayerDir("base-layer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(&image.Template{ID: TemplateID, Layers: []string{"base-layer"}, User: "user", Workdir: "/home/user", Recipe: "r"}); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "mcp-gateway")
	os.WriteFile(bin, []byte("gateway v1"), 0o644)
	ctx := context.Background()
	tm, err := EnsureMCPGateway(ctx, s, bin, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tm.ID != MCPGatewayID || len(tm.Layers) != 2 || tm.Layers[0] != "base-layer" || tm.User != "user" {
		t.Fatalf("template %+v", tm)
	}
	top := s.LayerDir(tm.Layers[1])
	fi, err := os.Stat(filepath.Join(top, MCPGatewayBinaryPath))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("gateway in the layer: %v %v", fi, err)
	}
	if got, _ := os.ReadFile(filepath.Join(top, MCPGatewayBinaryPath)); string(got) != "gateway v1" {
		t.Fatalf("gateway content %q", got)
	}
	if fi, err := os.Stat(filepath.Join(top, "etc/mcp-gateway")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("/etc/mcp-gateway: %v %v", fi, err)
	}
	again, err := EnsureMCPGateway(ctx, s, bin, nil)
	if err != nil || again.Layers[1] != tm.Layers[1] {
		t.Fatalf("same binary rebuilt: %v %v", again, err)
	}
	os.WriteFile(bin, []byte("gateway v2"), 0o644)
	next, err := EnsureMCPGateway(ctx, s, bin, nil)
	if err != nil || next.Layers[1] == tm.Layers[1] {
		t.Fatalf("a new binary kept the old layer: %v %v", next, err)
	}
	if _, err := EnsureMCPGateway(ctx, s, filepath.Join(dir, "missing"), nil); err == nil {
		t.Fatal("a missing binary built a template")
	}
}
