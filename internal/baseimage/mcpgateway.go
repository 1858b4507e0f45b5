package baseimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/warren-sandbox/warren/internal/image"
)

// MCPGatewayID is the template the E2B SDK creates sandboxes of when
// Sandbox.create is given `mcp` (Sandbox.defaultMcpTemplate).
const MCPGatewayID = "mcp-gateway"

// mcpGatewayRecipe names the recipe below; the template's layer ID also
// names the gateway binary's hash and the base layer, so a new gateway or
// a new base makes a new layer.
const mcpGatewayRecipe = "mcpgw-v1"

// MCPGatewayBinaryPath is where the layer puts the gateway: on the PATH of
// the SDK's `mcp-gateway --config` command.
const MCPGatewayBinaryPath = "usr/local/bin/mcp-gateway"

// EnsureMCPGateway builds the mcp-gateway template on top of base (which
// must exist: Ensure) unless one of the current recipe, gateway binary and
// base exists. Its one layer holds the static gateway (gatewayBin, which
// `make build` makes beside warren, internal/mcpgateway) and the gateway's
// directory /etc/mcp-gateway; Node and npm for npx servers, git for
// cloning, python3 and sudo come from base. Nothing runs in a chroot, so
// the build takes as long as copying the binary.
func EnsureMCPGateway(ctx context.Context, s *image.Store, gatewayBin string, progress io.Writer) (*image.Template, error) {
	base, err := s.Template(TemplateID)
	if err != nil {
		return nil, fmt.Errorf("baseimage: %s needs the base template: %w", MCPGatewayID, err)
	}
	bin, err := os.ReadFile(gatewayBin)
	if err != nil {
		return nil, fmt.Errorf("baseimage: the gateway binary for %s: %w (build it with `make build`)", MCPGatewayID, err)
	}
	sum := sha256.Sum256(bin)
	want := image.Template{
		ID: MCPGatewayID, Layers: base.Layers, User: base.User, Workdir: base.Workdir,
		Recipe: mcpGatewayRecipe + "-" + hex.EncodeToString(sum[:6]) + "-on-" + base.Layers[len(base.Layers)-1],
	}
	return s.EnsureTemplate(ctx, want, func(ctx context.Context, dir string, step image.StepFunc, out io.Writer) error {
		step("installing the gateway at /%s", MCPGatewayBinaryPath)
		return writeMCPGatewayLayer(dir, bin)
	}, progress)
}

// writeMCPGatewayLayer fills the layer dir: directories as base has them
// (root's, 0755), /etc/mcp-gateway root's only (it will hold the token).
func writeMCPGatewayLayer(dir string, bin []byte) error {
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{"usr", 0o755}, {"usr/local", 0o755}, {"usr/local/bin", 0o755}, {"etc", 0o755}, {"etc/mcp-gateway", 0o700}} {
		p := filepath.Join(dir, d.path)
		if err := os.Mkdir(p, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil { // past the umask
			return err
		}
	}
	p := filepath.Join(dir, MCPGatewayBinaryPath)
	if err := os.WriteFile(p, bin, 0o755); err != nil {
		return err
	}
	return os.Chmod(p, 0o755)
}
