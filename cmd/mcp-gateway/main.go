// Command mcp-gateway is Warren's MCP gateway, run inside sandboxes of the
// mcp-gateway template by the E2B SDK's Sandbox.create({ mcp }); see
// internal/mcpgateway.
package main

import (
	"os"

	"github.com/warren-sandbox/warren/internal/mcpgateway"
)

func main() { os.Exit(mcpgateway.Main(os.Args[1:], os.Stderr)) }
