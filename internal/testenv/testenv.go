// Package testenv holds what tests of several packages need from the real
// system: a freshly built envd to put into sandboxes, root, a tiny layer.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildEnvd builds the static envd binary (CGO_ENABLED=0, as `make build`
// does) into dir and returns its path.
func BuildEnvd(dir string) (string, error) {
	out := filepath.Join(dir, "envd")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/warren-sandbox/warren/cmd/envd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build envd: %v\n%s", err, b)
	}
	return out, nil
}
