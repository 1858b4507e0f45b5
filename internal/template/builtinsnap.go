package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/codeinterp"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// builtinReadyCmd is the ready command of a built-in template's start
// snapshot: what proves that the sandbox is what its first create wants.
// For the code interpreter, envd's default Python kernel is up (envd
// marks it once the kernel's bridge has said ready): a restored sandbox
// answers its first cell without starting Python.
func builtinReadyCmd(id string) string {
	if id == baseimage.CodeInterpreterID {
		return "test -e " + codeinterp.DefaultReadyPath
	}
	return ""
}

// builtinSnapshotID names the start snapshot of built-in template img: it
// is derived from the template's layers, its ready command and the
// runtime, so a new layer or runtime makes a new one, and the same ones
// find it cached.
func (b *Builder) builtinSnapshotID(img *image.Template, ready string) string {
	parts, _ := json.Marshal([]any{"builtin-start", img.ID, img.Layers, img.User, img.Workdir, ready, b.cfg.Node.Runtime().Name()})
	h := sha256.Sum256(parts)
	return "snap-" + hex.EncodeToString(h[:])[:40]
}

// SnapshotBuiltin gives built-in template id a start snapshot, unless it
// has a current one (then it returns at once): a sandbox of the template
// started and checkpointed once ready, which its creates and warm pools
// then restore instead of booting. It is an optimisation: until it is
// recorded, creates boot the template; on a runtime without checkpoints
// it does nothing; a failure leaves the template as it was. Snapshots are
// cached by ID (builtinSnapshotID), like a build's. Cancelling ctx stops
// it; what it made by then is removed, or whole.
func (b *Builder) SnapshotBuiltin(ctx context.Context, id string) error {
	ready := builtinReadyCmd(id)
	if ready == "" {
		return fmt.Errorf("template: %s has no start snapshot", id)
	}
	rt := b.cfg.Node.Runtime()
	if !rt.Capabilities().Checkpoint {
		b.log.Info("built-in template boots: the runtime cannot checkpoint", "template", id, "runtime", rt.Name(),
			"detail", rt.Capabilities().CheckpointDetail)
		return nil
	}
	img, err := b.cfg.Images.Template(id)
	if err != nil {
		return err
	}
	if img.Snapshot != "" {
		if _, ok := b.cachedSnapshot(img.Snapshot); ok {
			return nil // recorded over its current layers (SetBuiltinSnapshot)
		}
		b.log.Warn("the built-in template's start snapshot is gone; taking it again", "template", id, "snapshot", img.Snapshot)
	}
	layers := image.BuiltLayers(img)
	img.Layers = layers
	img.Snapshot, img.SnapshotToken = "", ""
	img.ReadyCmd = ready
	snapID := b.builtinSnapshotID(img, ready)
	token, ok := b.cachedSnapshot(snapID)
	if !ok {
		begin := time.Now()
		lg := newSinkLog(func(entries []store.BuildLogEntry) {
			for _, e := range entries {
				b.log.Debug("built-in template snapshot", "template", id, "level", e.Level, "line", e.Message)
			}
		})
		token, err = b.takeStartSnapshot(ctx, lg, startSnapshot{ID: snapID, Image: img,
			CPUCount: sandbox.DefaultResources.CPUCount, MemoryMB: builtinMemoryMB(id)}) // as its sandboxes have
		lg.close()
		if err != nil {
			return fmt.Errorf("template: the start snapshot of %s: %w", id, err)
		}
		b.log.Info("built-in template snapshot taken", "template", id, "snapshot", snapID,
			"took", time.Since(begin).Round(100*time.Millisecond).String())
	}
	err = b.cfg.Images.SetBuiltinSnapshot(ctx, id, layers, snapID, token)
	if errors.Is(err, image.ErrTemplateChanged) {
		b.log.Info("built-in template changed while its snapshot was taken; the next start snapshots it", "template", id)
		return nil
	}
	if err != nil {
		return fmt.Errorf("template: recording the start snapshot of %s: %w", id, err)
	}
	b.log.Info("built-in template restores from its start snapshot", "template", id, "snapshot", snapID)
	return nil
}
