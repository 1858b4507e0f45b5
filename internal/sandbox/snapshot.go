package sandbox

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// Snapshots and forks: a running sandbox checkpointed in place (frozen for
// the checkpoint and the copy of its disk, then it runs on with its ID and
// end time untouched), and new sandboxes restored from that.

// MaxForkCount bounds the sandboxes one fork request makes (E2B's bound);
// the node's and the team's limits apply to each as to a create.
const MaxForkCount = 100

// forkConcurrency is how many of a fork's sandboxes are restored at once.
// A restore waits on much besides the CPU (process starts, the runtime's
// handshakes), so more than the CPUs overlap well: on a 2-core node 10 at
// a time took 1.3-1.4 s where 4 took 1.8 s and 2 took 2.0 s (fork of 10,
// 50 MiB); the bound keeps a fork of 100 from starting 100 at once.
const forkConcurrency = 8

// forkSnapshotPrefix names, in the image store's snapshots/, the snapshot
// a fork restores its sandboxes from while it runs.
const forkSnapshotPrefix = "fork-"

// Snapshot is a running sandbox's snapshot as Snapshot took it: the
// sandbox's record at the time, and what sandboxes restored from it are
// made of.
type Snapshot struct {
	Sandbox store.Sandbox
	// Image is the image template sandboxes restored from it use (without
	// ID or Snapshot, which the caller names): the sandbox's layers,
	// user, workdir and template envs, the envd token inside the
	// checkpoint, and its disk.
	Image image.Template
}

// Snapshot checkpoints a team's running sandbox into dir (which must not
// exist) with a copy of its disk (node.Snapshot); the sandbox runs on. A
// paused sandbox is ErrConflict: resume it first.
func (m *Manager) Snapshot(ctx context.Context, teamID team.ID, id, dir string) (Snapshot, error) {
	l, err := m.lookup(teamID.Scope(), id)
	if err != nil {
		return Snapshot{}, err
	}
	if !m.canCheckpoint() {
		return Snapshot{}, fmt.Errorf("%w: snapshots need checkpoints, which this node's %s runtime cannot do here (%s)",
			ErrInvalid, m.cfg.Node.Runtime().Name(), m.cfg.Node.Runtime().Capabilities().CheckpointDetail)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	paused, err := m.pausedNow(l)
	if err != nil {
		return Snapshot{}, err
	}
	if paused {
		return Snapshot{}, fmt.Errorf("%w: sandbox %s is paused; resume it first", ErrConflict, id)
	}
	rec, err := m.cfg.Store.GetSandbox(ctx, id)
	if err != nil {
		return Snapshot{}, err
	}
	img, err := parseImage(rec)
	if err != nil {
		return Snapshot{}, err
	}
	if err := m.checkpointSpace(rec.MemoryMB); err != nil {
		return Snapshot{}, err
	}
	if err := m.cfg.Node.Snapshot(ctx, m.instance(l), dir); err != nil {
		return Snapshot{}, fmt.Errorf("sandbox: snapshot of %s: %w", id, err)
	}
	var mounts []image.VolumeMount
	for _, vm := range rec.VolumeMounts {
		mounts = append(mounts, image.VolumeMount{VolumeID: vm.VolumeID, Name: vm.Name, Path: vm.Path})
	}
	return Snapshot{Sandbox: rec, Image: image.Template{
		Layers: img.Layers, User: img.User, Workdir: img.Workdir, Envs: img.Envs,
		SnapshotToken: rec.EnvdAccessToken, SnapshotDisk: true, SnapshotMounts: mounts,
	}}, nil
}

// ForkResult is one sandbox of a fork: its record, or why it was not made.
type ForkResult struct {
	Sandbox store.Sandbox
	Err     error
}

// Fork snapshots a team's running sandbox once and restores count new
// sandboxes from it, each with its own ID, hostname, slot, tokens and
// timeout, and the parent's metadata, environment and settings. The
// parent runs on, its ID and end time untouched. Each sandbox succeeds or
// fails on its own (limits apply to each as to a create); an error is
// returned only when nothing could be forked (unknown sandbox, snapshot
// failed). A paused sandbox is forked from its pause checkpoint and stays
// paused (snapshotblobs.go).
func (m *Manager) Fork(ctx context.Context, teamID team.ID, id string, timeout time.Duration, count int) ([]ForkResult, error) {
	if count < 1 || count > MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", ErrInvalid, MaxForkCount)
	}
	if max := m.maxTimeout(); timeout <= 0 || timeout > max {
		return nil, fmt.Errorf("%w: timeout must be greater than 0 and at most %d seconds", ErrInvalid, int(max.Seconds()))
	}
	// Before anything is made; a sandbox paused in the blob store by a
	// lost node is taken over here first (snapshotblobs.go).
	l, err := m.lookupOrAdopt(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	snapID := forkSnapshotPrefix + NewID()
	dir := m.cfg.Images.SnapshotDir(snapID)
	snap, err := m.forkSnapshot(ctx, teamID, l, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := m.cfg.Images.RemoveSnapshot(snapID); err != nil && !os.IsNotExist(err) {
			m.log.WarnContext(ctx, "removing a fork's snapshot", "snapshot", snapID, "err", err)
		}
	}()
	parent := snap.Sandbox
	req := childRequest(teamID, parent, timeout)
	img := snap.Image
	img.ID, img.Snapshot = parent.TemplateID, snapID
	resolved := Template{ID: parent.TemplateID, Alias: parent.Alias, Image: &img, CPUCount: parent.CPUCount, MemoryMB: parent.MemoryMB, fork: true}
	out := make([]ForkResult, count)
	sem := make(chan struct{}, forkConcurrency)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i].Sandbox, out[i].Err = m.createFrom(ctx, req, resolved)
		}()
	}
	wg.Wait()
	return out, nil
}

// childRequest is the create request of a sandbox forked from parent's
// record: everything the parent was created with (metadata, environment,
// lifecycle, network and what else a record carries) but its timeout.
// The one place a record becomes a CreateRequest, as nodeRequest is the
// one place it becomes a node.CreateRequest: what a sandbox gains (egress
// rules, volumes) is carried to its forks here. The child is teamID's,
// the team the parent was found in.
func childRequest(teamID team.ID, parent store.Sandbox, timeout time.Duration) CreateRequest {
	autoPauseMemory := parent.AutoPauseMemory
	return CreateRequest{
		TeamID: teamID, TemplateID: parent.TemplateID, Timeout: timeout,
		Metadata: parent.Metadata, EnvVars: parent.EnvVars, AutoPause: parent.AutoPause,
		AutoPauseMemory: &autoPauseMemory, AutoResume: parent.AutoResume, Secure: true,
		AllowInternetAccess: parent.AllowInternetAccess, Extra: ParseExtra(parent.Extra),
		VolumeMounts: volumeMounts(parent),
	}
}
