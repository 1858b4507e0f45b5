package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/setup"
)

const imageUsage = `usage: warren image import [--data-dir DIR] NAME ARCHIVE

Unpacks an image archive into Warren's layers and records it as NAME
(e.g. myimage:1.0; without a tag, :latest), replacing an earlier import of
that name. This is how a machine without internet gets images. ARCHIVE is
a "docker save" tarball or an OCI image layout as a tar, e.g. from
"skopeo copy docker://debian:12 oci-archive:debian.tar" or
"docker buildx build --output type=oci,dest=image.tar"; gzip'd is fine.`

// runImage runs `warren image ...`.
func runImage(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "import" {
		return errors.New(imageUsage)
	}
	fs := flag.NewFlagSet("image import", flag.ExitOnError)
	dataDir := fs.String("data-dir", setup.DefaultDataDir, "where Warren keeps its state")
	fs.Usage = func() { fmt.Fprintln(fs.Output(), imageUsage); fs.PrintDefaults() }
	fs.Parse(args[1:])
	if fs.NArg() != 2 {
		return errors.New(imageUsage)
	}
	// The store wants an absolute data dir; a relative one means this one.
	dir, err := filepath.Abs(*dataDir)
	if err != nil {
		return err
	}
	s, err := image.Open(dir)
	if err != nil {
		return err
	}
	t, err := oci.Import(ctx, s, fs.Arg(0), fs.Arg(1))
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "imported %s: %d layers, user %s, workdir %q (template %s)\n", t.Recipe, len(t.Layers), t.User, t.Workdir, t.ID)
	return nil
}
