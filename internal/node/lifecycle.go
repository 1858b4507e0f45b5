package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/steptrace"
)

// Pausing to disk, resuming, and snapshots.
//
// A paused sandbox holds nothing of the node but files: its root
// filesystem, unmounted, with its writable layer (Rootfs.Detach), and,
// when its memory was kept, a checkpoint image beside it. Its container,
// memory, CPU share and network slot are released. Resuming remounts the
// same root filesystem, takes a fresh slot and restores the checkpoint
// (or boots anew without one). The runtime re-addresses the restored
// network stack from the new slot (gVisor re-reads the namespace's
// addresses and routes on restore), so the slot need not be the old one;
// docs/design/lifecycle.md has the measurements behind that choice.
//
// A snapshot is a checkpoint of a running sandbox that goes on running,
// plus a copy of its writable layer's disk image taken while it was
// frozen, so that the two match: Restore with CreateRequest.DiskImage
// starts any number of sandboxes from it.

// Paused is a sandbox paused to disk on this node: nothing of it runs.
type Paused struct {
	ID string
	// Dir holds its root filesystem (Rootfs.Home), unmounted.
	Dir string
	// Checkpoint is the checkpoint image of its memory, inside Dir; ""
	// when it was paused without its memory (it boots anew on resume).
	Checkpoint string
}

// SnapshotDiskName is the copy of the writable layer's disk image in a
// snapshot's directory (Snapshot).
const SnapshotDiskName = "disk.img"

// checkpointTemp is where a checkpoint is written before it is renamed
// into place: a checkpoint directory that exists is whole.
func checkpointTemp(final string) string { return final + ".tmp" }

// PauseToDisk stops a running sandbox and keeps it on disk: SaveToDisk,
// then ReleaseSaved. A failure of the release is returned with a valid
// Paused: the sandbox is saved, and what is left is taken down by the next
// ResumeFromDisk or DeletePaused.
func (n *Node) PauseToDisk(ctx context.Context, inst *Instance, keepMemory bool) (Paused, error) {
	p, err := n.SaveToDisk(ctx, inst, keepMemory)
	if err != nil {
		return Paused{}, err
	}
	return p, n.ReleaseSaved(ctx, inst)
}

// SaveToDisk stops a running sandbox so that it can be resumed from disk:
// with keepMemory its memory is checkpointed first. The sandbox is frozen
// while the checkpoint is written (so that its files stay as the
// checkpoint saw them) and killed only once the checkpoint is complete:
// if checkpointing fails it is thawed and runs on, unchanged, and the
// error says so. When it returns without error nothing of the sandbox
// runs any more (its memory is freed), but its container's state, its
// root filesystem's mounts and its slot are still held: ReleaseSaved
// releases them, before anything else is done with it.
func (n *Node) SaveToDisk(ctx context.Context, inst *Instance, keepMemory bool) (Paused, error) {
	ctx = context.WithoutCancel(ctx) // half a pause is worse than a late one
	p := Paused{ID: inst.ID, Dir: inst.Rootfs.Home()}
	if keepMemory {
		dir, err := n.checkpointFrozen(ctx, inst)
		if err != nil {
			return Paused{}, err
		}
		p.Checkpoint = dir
	} else if err := n.cfg.Runtime.Kill(ctx, inst.ID); err != nil {
		return Paused{}, fmt.Errorf("node: stopping %s: %w", inst.ID, err)
	}
	return p, nil
}

// ReleaseSaved releases what a sandbox stopped by SaveToDisk still holds:
// its container's state and cgroup, its root filesystem's mounts (the
// files stay) and its slot. inst is spent afterwards.
func (n *Node) ReleaseSaved(ctx context.Context, inst *Instance) error {
	return n.releaseKeeping(context.WithoutCancel(ctx), inst, true)
}

// checkpointFrozen freezes the sandbox, writes its checkpoint into the
// root filesystem's checkpoint dir, and kills it; on failure it thaws it.
func (n *Node) checkpointFrozen(ctx context.Context, inst *Instance) (string, error) {
	final := inst.Rootfs.CheckpointDir()
	tmp := checkpointTemp(final)
	for _, d := range []string{tmp, final} {
		if err := os.RemoveAll(d); err != nil {
			return "", fmt.Errorf("node: clearing %s: %w", d, err)
		}
	}
	if err := n.cfg.Runtime.Pause(ctx, inst.ID); err != nil {
		return "", fmt.Errorf("node: freezing %s for its checkpoint: %w", inst.ID, err)
	}
	fail := func(err error) (string, error) {
		_ = os.RemoveAll(tmp)
		if terr := n.cfg.Runtime.Resume(ctx, inst.ID); terr != nil {
			return "", fmt.Errorf("node: checkpointing %s: %w; thawing it failed too: %v", inst.ID, err, terr)
		}
		return "", fmt.Errorf("node: checkpointing %s (it runs on): %w", inst.ID, err)
	}
	// leaveRunning: a failed checkpoint must not take the sandbox with it
	// (runsc kills a sandbox whose save fails otherwise). It stays frozen
	// (the runtime's pauses nest) until Kill below.
	if err := n.cfg.Runtime.Checkpoint(ctx, inst.ID, tmp, true); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fail(err)
	}
	if err := n.cfg.Runtime.Kill(ctx, inst.ID); err != nil {
		_ = os.RemoveAll(final)
		return fail(fmt.Errorf("stopping it after the checkpoint: %w", err))
	}
	return final, nil
}

// ResumeFromDisk starts a paused sandbox again: its kept root filesystem
// is remounted, a fresh slot taken, and its checkpoint restored (with
// restoreMemory and a checkpoint) or envd booted anew, and it returns once
// envd is healthy. req must be the sandbox's own (same ID, layers, user
// and workdir as when it was made). commit runs once the slot and root
// filesystem are ready and before the runtime starts anything, so that
// the caller can record the slot; its error aborts the resume. On any
// failure everything taken is released and the sandbox's files are kept
// as they were: it can be resumed again. The checkpoint is not removed
// (DropCheckpoint, once the caller has recorded the resume).
func (n *Node) ResumeFromDisk(ctx context.Context, req CreateRequest, p Paused, restoreMemory bool, commit func(*Instance) error) (_ *Instance, err error) {
	if req.ID != p.ID {
		return nil, fmt.Errorf("node: resuming %s with the request of %s", p.ID, req.ID)
	}
	ctx = context.WithoutCancel(ctx) // as in Create: a runtime cut short leaves processes behind
	// An interrupted earlier attempt may have left a container.
	if err := n.cfg.Runtime.Delete(ctx, req.ID); err != nil {
		return nil, fmt.Errorf("node: clearing what a previous attempt left of %s: %w", req.ID, err)
	}
	tr := steptrace.From(ctx)
	tr.Mark("runtime-clear")
	remount := func(ctx context.Context) (Rootfs, error) { return n.cfg.Rootfs.Remount(ctx, req.ID, req.Layers) }
	inst, spec, err := n.prepareKeeping(ctx, req, remount)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.releaseKeeping(ctx, inst, true)
		}
	}()
	if err := commit(inst); err != nil {
		return nil, err
	}
	tr.Mark("commit")
	if restoreMemory && p.Checkpoint != "" {
		if err := n.cfg.Runtime.Restore(ctx, spec, p.Checkpoint); err != nil {
			return nil, &ResumeError{Step: "restoring its memory checkpoint", Err: err}
		}
	} else if err := n.cfg.Runtime.Start(ctx, spec); err != nil {
		return nil, &ResumeError{Step: "booting it", Err: err}
	}
	tr.Mark("runtime-restore")
	if err := n.waitHealthy(ctx, inst); err != nil {
		return nil, &ResumeError{Step: "waiting for its envd", Err: err}
	}
	tr.Mark("envd-health")
	return inst, nil
}

// prepareKeeping is prepare for a kept root filesystem: on failure it is
// detached again, never removed.
func (n *Node) prepareKeeping(ctx context.Context, req CreateRequest, mount func(context.Context) (Rootfs, error)) (*Instance, runtime.Spec, error) {
	inst, spec, err := n.prepare(ctx, req, mount, false, true)
	if err != nil {
		return nil, runtime.Spec{}, &ResumeError{Step: "preparing its network and file system", Err: err}
	}
	return inst, spec, nil
}

// ResumeError says which step of a resume failed; the sandbox is still
// paused and its files are intact.
type ResumeError struct {
	Step string
	Err  error
}

func (e *ResumeError) Error() string { return "node: resuming failed " + e.Step + ": " + e.Err.Error() }
func (e *ResumeError) Unwrap() error { return e.Err }

// DropCheckpoint removes a resumed sandbox's checkpoint image. On the
// caller's path (a resume's answer waits for it) the image is only
// renamed aside, which frees its name for the next pause at once; its
// files, tens to hundreds of MiB, are removed in the background, with
// any an earlier removal left (a restart cut it short). The sandbox's own
// removal takes whatever is still there.
func (n *Node) DropCheckpoint(p Paused) error {
	if p.Checkpoint == "" {
		return nil
	}
	aside := fmt.Sprintf("%s%s%d", p.Checkpoint, droppedSuffix, time.Now().UnixNano())
	if err := os.Rename(p.Checkpoint, aside); errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	go removeDropped(p.Checkpoint)
	return nil
}

// droppedSuffix marks a checkpoint image renamed aside to be removed.
const droppedSuffix = ".dropped-"

// removeDropped removes the images of checkpoint renamed aside.
func removeDropped(checkpoint string) {
	dir, prefix := filepath.Dir(checkpoint), filepath.Base(checkpoint)+droppedSuffix
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// DeletePaused removes a paused sandbox's files, and anything an
// interrupted pause or resume left of it (container, mounts).
func (n *Node) DeletePaused(ctx context.Context, p Paused) error {
	return errors.Join(n.cfg.Runtime.Delete(ctx, p.ID), n.cfg.Rootfs.Remove(p.ID))
}

// Settle takes down what an interrupted pause or resume left of a paused
// sandbox after a restart: its container and root filesystem mounts (its
// files stay), and its slot slotName if it still has one. It reports the
// checkpoint that is complete, if any, so that the caller can tell a
// sandbox paused with its memory from one that lost it.
func (n *Node) Settle(ctx context.Context, id, slotName, checkpoint string) (complete bool, err error) {
	var errs []error
	errs = append(errs, n.cfg.Runtime.Delete(ctx, id))
	if root, ok := n.cfg.Rootfs.Kept(id); ok {
		errs = append(errs, root.Detach())
		_ = os.RemoveAll(checkpointTemp(root.CheckpointDir()))
	}
	if slotName != "" {
		if s, ok := n.cfg.Network.Adopt(slotName); ok {
			errs = append(errs, n.cfg.Network.Release(s))
		}
	}
	if checkpoint != "" {
		_, serr := os.Stat(filepath.Join(checkpoint, "checkpoint.img"))
		complete = serr == nil
	}
	return complete, errors.Join(errs...)
}

// State reports a sandbox's container state (runtime.ErrNotFound when it
// has none).
func (n *Node) State(ctx context.Context, id string) (runtime.State, error) {
	return n.cfg.Runtime.State(ctx, id)
}

// Snapshot writes a checkpoint of a running sandbox into dir (created; it
// must not exist) together with a copy of its writable layer's disk image
// (SnapshotDiskName), taken while the sandbox is frozen so that the two
// match. The sandbox runs on afterwards, whatever happened. Restore with
// CreateRequest.DiskImage = filepath.Join(dir, SnapshotDiskName) starts a
// sandbox from it.
func (n *Node) Snapshot(ctx context.Context, inst *Instance, dir string) (err error) {
	ctx = context.WithoutCancel(ctx)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("node: snapshot dir: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := n.cfg.Runtime.Pause(ctx, inst.ID); err != nil {
		return fmt.Errorf("node: freezing %s for a snapshot: %w", inst.ID, err)
	}
	defer func() {
		if terr := n.cfg.Runtime.Resume(ctx, inst.ID); terr != nil {
			err = errors.Join(err, fmt.Errorf("node: thawing %s after its snapshot: %w", inst.ID, terr))
		}
	}()
	if err := n.cfg.Runtime.Checkpoint(ctx, inst.ID, dir, true); err != nil {
		return fmt.Errorf("node: checkpointing %s: %w", inst.ID, err)
	}
	if err := inst.Rootfs.CopyDisk(filepath.Join(dir, SnapshotDiskName)); err != nil {
		return fmt.Errorf("node: copying the disk of %s: %w", inst.ID, err)
	}
	return nil
}

// Flush writes a paused sandbox's files (its checkpoint, its disk image)
// through to the disk, so that they survive a power loss; a clean reboot
// flushes them anyway. Files removed meanwhile (a resume dropped the
// checkpoint) are skipped.
func Flush(p Paused) error {
	var errs []error
	sync := func(path string) {
		f, err := os.Open(path)
		if err != nil {
			if !os.IsNotExist(err) {
				errs = append(errs, err)
			}
			return
		}
		if err := f.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("node: flushing %s: %w", path, err))
		}
		f.Close()
	}
	if p.Checkpoint != "" {
		entries, _ := os.ReadDir(p.Checkpoint)
		for _, e := range entries {
			if e.Type().IsRegular() {
				sync(filepath.Join(p.Checkpoint, e.Name()))
			}
		}
		sync(p.Checkpoint)
	}
	sync(filepath.Join(p.Dir, rootfs.DiskImageName))
	sync(p.Dir)
	return errors.Join(errs...)
}

// AdoptKept takes over a sandbox whose pause a restart cut short: its
// container and root filesystem (mounted or not), without a slot (the
// pause had released it from the record). PauseToDisk finishes the pause.
func (n *Node) AdoptKept(ctx context.Context, id string) (*Instance, error) {
	root, ok := n.cfg.Rootfs.Kept(id)
	if !ok {
		return nil, fmt.Errorf("node: sandbox %s has no root filesystem", id)
	}
	return &Instance{ID: id, Rootfs: root, LogPath: root.LogPath()}, nil
}

// KeptHome is where sandbox id's kept files (Paused.Dir) belong on this
// node: where a sandbox paused on another node is unpacked to resume
// here. The checkpoint, if any, goes in its "checkpoint" subdirectory.
func (n *Node) KeptHome(id string) (string, error) {
	h, ok := n.cfg.Rootfs.(interface{ HomeDir(string) (string, error) })
	if !ok {
		return "", errors.New("node: this node's root filesystems cannot take a sandbox paused elsewhere")
	}
	return h.HomeDir(id)
}
