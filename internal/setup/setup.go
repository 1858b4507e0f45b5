// Package setup installs what a Warren node needs, idempotently: the OCI
// runtimes (runsc built from the Go module proxy, runc from Debian) and the
// base template's root filesystem. `warren setup` runs it; `make run` and
// `make test` call that.
package setup

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/runtime"
)

// DefaultDataDir is where Warren keeps its state.
const DefaultDataDir = "/var/lib/warren"

// Options configures Run.
type Options struct {
	DataDir string
	// Mirror overrides the Debian mirror the base is built from.
	Mirror string
	// Runtimes to install: "runsc", "runc". Default: both.
	Runtimes []string
}

// RunscPath is where Run installs runsc for a data directory.
func RunscPath(dataDir string) string { return filepath.Join(dataDir, "bin", "runsc") }

// Run installs whatever is missing and reports progress line by line.
func Run(ctx context.Context, opts Options, progress io.Writer) error {
	if opts.DataDir == "" {
		opts.DataDir = DefaultDataDir
	}
	if len(opts.Runtimes) == 0 {
		opts.Runtimes = []string{"runsc", "runc"}
	}
	start := time.Now()
	for _, rt := range opts.Runtimes {
		switch rt {
		case "runsc":
			fmt.Fprintln(progress, "setup: runsc (gVisor)")
			p, err := runtime.EnsureRunsc(ctx, filepath.Dir(RunscPath(opts.DataDir)), progress)
			if err != nil {
				return fmt.Errorf("setup: runsc: %w", err)
			}
			fmt.Fprintf(progress, "setup: runsc ready at %s\n", p)
		case "runc":
			fmt.Fprintln(progress, "setup: runc")
			p, err := runtime.EnsureRunc(ctx, progress)
			if err != nil {
				return fmt.Errorf("setup: runc: %w", err)
			}
			fmt.Fprintf(progress, "setup: runc ready at %s\n", p)
		default:
			return fmt.Errorf("setup: unknown runtime %q (want runsc or runc)", rt)
		}
	}
	store, err := image.Open(opts.DataDir)
	if err != nil {
		return err
	}
	fmt.Fprintln(progress, "setup: base template (Debian 12)")
	if _, err := store.EnsureBase(ctx, image.BaseOptions{Mirror: opts.Mirror}, progress); err != nil {
		return fmt.Errorf("setup: base template: %w", err)
	}
	fmt.Fprintf(progress, "setup: done in %.1fs\n", time.Since(start).Seconds())
	return nil
}
