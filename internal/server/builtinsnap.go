package server

import (
	"context"
	"log/slog"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/template"
)

// snapshotCodeInterpreter gives code-interpreter-v1 its start snapshot
// (template.Builder.SnapshotBuiltin) once the template exists: after
// build, the background build of it, if there is one. It is an
// optimisation: until it is recorded creates boot the template, and a
// failure is logged and leaves the template bootable (the next start
// tries again).
func snapshotCodeInterpreter(ctx context.Context, images *image.Store, builder *template.Builder, build *setup.Background, log *slog.Logger) {
	id := baseimage.CodeInterpreterID
	if build != nil {
		select {
		case <-build.Done():
		case <-ctx.Done():
			return
		}
		if state, _, _ := build.State(); state != setup.BuildReady {
			return
		}
	}
	if _, err := images.Template(id); err != nil {
		return // not built on this node: nothing to snapshot
	}
	err := builder.SnapshotBuiltin(ctx, id)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		log.Info("built-in template snapshot stopped with the server; the next start takes it", "template", id)
	default:
		log.Error("built-in template snapshot failed: its sandboxes boot (slower first cell); the next start tries again",
			"template", id, "err", err)
	}
}
