// Package node turns a template's layers into a running, isolated sandbox
// on this machine, and takes it apart again.
//
// What the node makes is an Instance: a sandbox's resources on this
// machine, the sum of three, each owned by another package: a network
// slot (internal/network), a root filesystem mounted over the template's
// layers (internal/rootfs over internal/image), and a container whose
// first process is envd (internal/runtime). Create acquires them in that
// order and waits until envd answers GET /health on the slot's address; if
// any step fails, everything acquired so far is released, so a failed
// create leaves nothing behind. Delete releases them in reverse order.
// Cleanup removes what a crashed previous run left and the caller does not
// know.
//
// A running sandbox can be paused to disk (PauseToDisk: its memory
// checkpointed, everything but its files released) and resumed
// (ResumeFromDisk), or snapshotted in place (Snapshot) for any number of
// Restores: lifecycle.go.
//
// An Instance is not the sandbox of the API: that one's lifecycle (team,
// state, timeouts, tokens) is the sandbox manager's (internal/sandbox),
// and its record the store's. The node keeps no records of its own: the
// manager persists what it needs to find a sandbox again, and hands back
// the Instance it got from Create.
package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/rootpath"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/steptrace"
)

// Rootfs is a sandbox's mounted root filesystem.
type Rootfs interface {
	// Dir is the directory to use as the container's root.
	Dir() string
	// Unmount removes the mount and everything created for it.
	Unmount() error
	// LogPath is the host file for envd's output: on the file system of
	// the writable layer, so that the sandbox's disk limit bounds it too.
	// The sandbox cannot reach it through its root filesystem.
	LogPath() string
	// Home is the directory that holds everything of it, mounted or kept.
	Home() string
	// CheckpointDir is where a paused sandbox's checkpoint image goes,
	// inside Home.
	CheckpointDir() string
	// Detach unmounts it and keeps its files (a paused sandbox's).
	Detach() error
	// CopyDisk copies the writable layer's disk image to dst; the
	// sandbox must be frozen.
	CopyDisk(dst string) error
}

// Committer is a Rootfs whose writes can be kept as a read-only layer.
type Committer interface {
	// Commit makes the writes layer layerID and removes the rootfs.
	Commit(layerID string) error
}

// RootfsMounter mounts a root filesystem for a sandbox over read-only
// layers, with diskSizeMB (0: no limit) enforced on its writable layer.
type RootfsMounter interface {
	Mount(ctx context.Context, sandboxID string, layers []string, diskSizeMB int) (Rootfs, error)
	// Cleanup removes the root filesystems of sandboxes keep rejects.
	Cleanup(keep func(sandboxID string) bool) error
	// Adopt finds the root filesystem a previous run mounted for a
	// sandbox that is still running.
	Adopt(sandboxID string) (Rootfs, bool)
	// Remount mounts a detached root filesystem (Rootfs.Detach) again.
	Remount(ctx context.Context, sandboxID string, layers []string) (Rootfs, error)
	// MountCopy mounts a root filesystem whose writable layer is a copy
	// of a disk image (Rootfs.CopyDisk's).
	MountCopy(ctx context.Context, sandboxID string, layers []string, diskImage string) (Rootfs, error)
	// Remove deletes a sandbox's root filesystem, mounted or kept.
	Remove(sandboxID string) error
	// Kept finds a sandbox's root filesystem, mounted or kept.
	Kept(sandboxID string) (Rootfs, bool)
}

// Config wires a Node to its resources.
type Config struct {
	Runtime runtime.Runtime
	Network *network.Manager
	Rootfs  RootfsMounter
	// EnvdPath is the static envd binary on the host.
	EnvdPath string
	// ResolvConf, if set, is bind-mounted read-only over /etc/resolv.conf:
	// a file written by resolvconf, naming the resolvers the network's
	// egress policy opens port 53 of (network.Config.Resolvers).
	ResolvConf string
	// HealthTimeout bounds the wait for envd after start. Default 10s.
	HealthTimeout time.Duration
	// EgressProxy receives the TCP of sandboxes whose policy names
	// domains, rules or an upstream proxy; nil: such policies fail.
	EgressProxy *egress.Proxy
	// TrustCA, if set, is the PEM certificate of the egress proxy's CA:
	// it is added to every sandbox's system trust bundle and written to
	// TrustCAPath (see egress.go).
	TrustCA []byte
	// DiskIO bounds each sandbox's IO on the block device of its disk
	// (runtime.DiskIO); zero: no bound.
	DiskIO runtime.DiskIO
}

// Node creates and deletes sandboxes on this machine.
type Node struct {
	cfg    Config
	client *http.Client
}

// New returns a Node.
func New(cfg Config) (*Node, error) {
	if cfg.Runtime == nil || cfg.Network == nil || cfg.Rootfs == nil || cfg.EnvdPath == "" {
		return nil, errors.New("node: Runtime, Network, Rootfs and EnvdPath are required")
	}
	if cfg.HealthTimeout == 0 {
		cfg.HealthTimeout = 10 * time.Second
	}
	return &Node{
		cfg: cfg,
		client: &http.Client{Transport: &http.Transport{
			DialContext:       (&net.Dialer{Timeout: time.Second}).DialContext,
			DisableKeepAlives: true,
		}},
	}, nil
}

// Runtime is the node's OCI runtime backend.
func (n *Node) Runtime() runtime.Runtime { return n.cfg.Runtime }

// CreateRequest describes a sandbox to start.
type CreateRequest struct {
	ID string
	// Layers are the template's read-only layers, in the order the
	// RootfsMounter expects.
	Layers     []string
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
	// AccessToken is envd's initial access token ("" for none).
	AccessToken string
	// User and Workdir are envd's defaults ("" for user and home).
	User    string
	Workdir string
	// DiskImage, for a Restore, is a snapshot's copy of the checkpointed
	// sandbox's writable layer (Snapshot): the new sandbox's writable
	// layer is a copy of it, of its size (DiskSizeMB is ignored).
	DiskImage string
	// Egress is the sandbox's egress policy, in force before its first
	// process starts; nil: none (the node's rules only).
	Egress *Egress
	// Mounts are bind mounts into the sandbox (team volumes): each
	// Source a host directory, each Destination a clean absolute path
	// that the caller checked (internal/volume.CheckMountPaths). Their
	// mount points are made in the root filesystem as directories, never
	// through a link there.
	Mounts []runtime.Mount
	// Background starts the sandbox with a low CPU weight until
	// Foreground (runtime.Spec.Background): a warm pool's sandbox.
	Background bool
}

// Instance is a running sandbox's resources on this node: its slot, root
// filesystem and container (named by ID). The sandbox manager's sandbox
// holds one while it runs or is paused.
type Instance struct {
	ID     string
	Slot   *network.Slot
	Rootfs Rootfs
	// LogPath is the host file envd's stdout and stderr go to (see
	// Rootfs.LogPath); it is gone once the sandbox is deleted.
	LogPath string
	// egress is the policy in force (SetEgress), nil for none.
	egress *Egress
}

// EnvdURL is the base URL of the sandbox's envd, reachable from the host.
func (inst *Instance) EnvdURL() string {
	return "http://" + net.JoinHostPort(inst.Slot.SandboxIP.String(), strconv.Itoa(envdinfo.Port))
}

// Create starts a sandbox and returns once envd is healthy.
func (n *Node) Create(ctx context.Context, req CreateRequest) (_ *Instance, err error) {
	inst, spec, err := n.prepare(ctx, req, n.freshRoot(req), true, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.release(context.WithoutCancel(ctx), inst)
		}
	}()
	// Not cancelled with ctx: a runtime killed half-way through its start
	// can leave the sandbox's processes behind with its state gone, where
	// Delete no longer finds them. A cancelled create finishes the start
	// (bounded by the runtime's command timeout), then undoes it.
	if err := n.cfg.Runtime.Start(context.WithoutCancel(ctx), spec); err != nil {
		return nil, fmt.Errorf("node: starting sandbox %s: %w", req.ID, err)
	}
	steptrace.From(ctx).Mark("runtime-start")
	if err := n.waitHealthy(ctx, inst); err != nil {
		return nil, err
	}
	steptrace.From(ctx).Mark("envd-health")
	return inst, nil
}

// freshRoot mounts a new root filesystem for req: empty writable layer,
// or a copy of req.DiskImage.
func (n *Node) freshRoot(req CreateRequest) func(context.Context) (Rootfs, error) {
	return func(ctx context.Context) (Rootfs, error) {
		if req.DiskImage != "" {
			return n.cfg.Rootfs.MountCopy(ctx, req.ID, req.Layers, req.DiskImage)
		}
		return n.cfg.Rootfs.Mount(ctx, req.ID, req.Layers, req.DiskSizeMB)
	}
}

// prepare acquires the slot and the root filesystem (mount makes it) and
// builds the spec. writeRoot writes the files the node puts into a root
// filesystem (a resumed sandbox's are there already, as it saw them).
// On failure it releases what it took; with keepRoot the root filesystem
// is detached (a paused sandbox's kept one), not removed.
func (n *Node) prepare(ctx context.Context, req CreateRequest, mount func(context.Context) (Rootfs, error), writeRoot, keepRoot bool) (_ *Instance, _ runtime.Spec, err error) {
	if !runtime.ValidID(req.ID) {
		return nil, runtime.Spec{}, fmt.Errorf("node: invalid sandbox id %q", req.ID)
	}
	inst := &Instance{ID: req.ID}
	defer func() {
		if err != nil {
			n.releaseKeeping(context.WithoutCancel(ctx), inst, keepRoot)
		}
	}()
	if inst.Slot, err = n.cfg.Network.Acquire(ctx); err != nil {
		return nil, runtime.Spec{}, fmt.Errorf("node: network for %s: %w", req.ID, err)
	}
	steptrace.From(ctx).Mark("slot")
	if inst.Rootfs, err = mount(ctx); err != nil {
		return nil, runtime.Spec{}, fmt.Errorf("node: root filesystem for %s: %w", req.ID, err)
	}
	steptrace.From(ctx).Mark("rootfs-mount")
	inst.LogPath = inst.Rootfs.LogPath()
	if writeRoot {
		if err := n.writeRootFiles(inst.Rootfs.Dir(), req.ID); err != nil {
			return nil, runtime.Spec{}, fmt.Errorf("node: root filesystem for %s: %w", req.ID, err)
		}
	}
	// Volume mount points are checked on every start: a resumed sandbox's
	// root is as it left it.
	if err := prepareMountPoints(inst.Rootfs.Dir(), req.Mounts); err != nil {
		return nil, runtime.Spec{}, fmt.Errorf("node: root filesystem for %s: %w", req.ID, err)
	}
	if req.Egress != nil {
		if err := n.SetEgress(inst, *req.Egress); err != nil {
			return nil, runtime.Spec{}, err
		}
	}
	steptrace.From(ctx).Mark("root-files")
	args := []string{"--addr", fmt.Sprintf("0.0.0.0:%d", envdinfo.Port)}
	if req.User != "" {
		args = append(args, "--user", req.User)
	}
	if req.Workdir != "" {
		args = append(args, "--workdir", req.Workdir)
	}
	spec := runtime.Spec{
		ID:          req.ID,
		RootFS:      inst.Rootfs.Dir(),
		EnvdPath:    n.cfg.EnvdPath,
		Args:        args,
		AccessToken: req.AccessToken,
		NetNSPath:   inst.Slot.NetNSPath,
		ResolvConf:  n.cfg.ResolvConf,
		LogPath:     inst.LogPath,
		CPUCount:    req.CPUCount,
		MemoryMB:    req.MemoryMB,
		Mounts:      req.Mounts,
		Background:  req.Background,
	}
	if err := n.boundDiskIO(&spec, inst.LogPath); err != nil {
		return nil, runtime.Spec{}, fmt.Errorf("node: disk of %s: %w", req.ID, err)
	}
	return inst, spec, nil
}

// boundDiskIO gives spec the node's disk IO bounds on the block device of
// the sandbox's writable layer: the file system that holds its log (the
// sandbox's own disk, or the data dir's without a disk size). A file
// system on no block device gets none.
func (n *Node) boundDiskIO(spec *runtime.Spec, onDisk string) error {
	if n.cfg.DiskIO.IsZero() {
		return nil
	}
	dev, ok, err := runtime.BlockDeviceOf(filepath.Dir(onDisk))
	if err != nil || !ok {
		return err
	}
	spec.DiskIO, spec.DiskDevice = n.cfg.DiskIO, dev
	return nil
}

// Foreground gives a sandbox created with CreateRequest.Background the CPU
// weight of every other sandbox.
func (n *Node) Foreground(inst *Instance) error {
	return n.cfg.Runtime.Foreground(inst.ID)
}

// writeRootFiles writes what the node puts into a sandbox's root
// filesystem before it starts: /etc/hosts, and the files the runtime
// bind-mounts over. The root filesystem is the tenant's (a template may
// have made /etc/hosts a link to any host path), so every path is
// resolved inside it (rootpath) and links at these names are replaced by
// regular files in the sandbox's own writable layer, never followed.
func (n *Node) writeRootFiles(dir, id string) error {
	root, err := rootpath.Open(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	// The hostname must resolve, or tools such as sudo complain on every call.
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", id)
	if err := root.WriteFile("/etc/hosts", []byte(hosts), 0o644); err != nil {
		return fmt.Errorf("writing /etc/hosts: %w", err)
	}
	// The runtimes resolve mount destinations inside the root too, but
	// a link there would still put the mount somewhere else than its
	// name says (over the sandbox's own /etc/passwd, say): make the
	// destinations plain files.
	mountpoints := []string{runtime.EnvdMountPath}
	if n.cfg.ResolvConf != "" {
		mountpoints = append(mountpoints, "/etc/resolv.conf")
	}
	for _, m := range mountpoints {
		if err := root.EnsureFile(m, 0o644); err != nil {
			return fmt.Errorf("preparing the mount point %s: %w", m, err)
		}
	}
	return n.installTrustCA(root)
}

// prepareMountPoints makes each volume's mount point the directory its
// path names: a link there (a template's, or the sandbox's own before a
// pause, say /data -> /proc) would put the volume over whatever the link
// leads to, so one fails the start.
func prepareMountPoints(dir string, mounts []runtime.Mount) error {
	if len(mounts) == 0 {
		return nil
	}
	root, err := rootpath.Open(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, m := range mounts {
		if err := root.MkdirAllNoLinks(m.Destination, 0o755); err != nil {
			return fmt.Errorf("preparing the mount point %s: %w", m.Destination, err)
		}
	}
	return nil
}

// Delete stops the sandbox and releases everything it used. It tries every
// step even when one fails, and is safe to call again after a failure.
func (n *Node) Delete(ctx context.Context, inst *Instance) error {
	return n.release(ctx, inst)
}

func (n *Node) release(ctx context.Context, inst *Instance) error {
	return n.releaseKeeping(ctx, inst, false)
}

// releaseKeeping is release; with keepRoot the root filesystem is
// detached (its files kept, as a paused sandbox's), not removed.
func (n *Node) releaseKeeping(ctx context.Context, inst *Instance, keepRoot bool) error {
	var errs []error
	if inst.Slot != nil && n.cfg.EgressProxy != nil {
		n.cfg.EgressProxy.Unregister(inst.Slot.SandboxIP)
	}
	if err := n.cfg.Runtime.Delete(ctx, inst.ID); err != nil {
		errs = append(errs, err)
	}
	if inst.Rootfs != nil {
		unmount := inst.Rootfs.Unmount
		if keepRoot {
			unmount = inst.Rootfs.Detach
		}
		if err := unmount(); err != nil {
			errs = append(errs, err)
		} else {
			inst.Rootfs = nil
		}
	}
	if inst.Slot != nil {
		if err := n.cfg.Network.Release(inst.Slot); err != nil {
			errs = append(errs, err)
		} else {
			inst.Slot = nil
		}
	}
	return errors.Join(errs...)
}

// Commit stops the sandbox, keeps what it wrote to its root filesystem as
// layer layerID (a copy of its writable layer, see rootfs.Root.Commit),
// and releases everything else. Whatever fails, the sandbox is gone after.
func (n *Node) Commit(ctx context.Context, inst *Instance, layerID string) error {
	c, ok := inst.Rootfs.(Committer)
	if !ok {
		n.release(ctx, inst)
		return errors.New("node: this root filesystem cannot be committed")
	}
	if err := n.cfg.Runtime.Delete(ctx, inst.ID); err != nil {
		n.release(ctx, inst)
		return fmt.Errorf("node: stopping %s: %w", inst.ID, err)
	}
	err := c.Commit(layerID)
	inst.Rootfs = nil // Commit removes it, failed or not
	if rerr := n.release(ctx, inst); err == nil {
		err = rerr
	}
	return err
}

// Adopt takes over a sandbox a previous run of the caller started and
// that still runs: its container, root filesystem and network slot (named
// slotName). Call it after Cleanup, with the sandbox in keep.
func (n *Node) Adopt(ctx context.Context, id, slotName string) (*Instance, error) {
	st, err := n.cfg.Runtime.State(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("node: sandbox %s: %w", id, err)
	}
	if st != runtime.StateRunning && st != runtime.StatePaused {
		return nil, fmt.Errorf("node: sandbox %s is %s", id, st)
	}
	inst := &Instance{ID: id}
	var ok bool
	if inst.Rootfs, ok = n.cfg.Rootfs.Adopt(id); !ok {
		return nil, fmt.Errorf("node: sandbox %s has no root filesystem", id)
	}
	inst.LogPath = inst.Rootfs.LogPath()
	if inst.Slot, ok = n.cfg.Network.Adopt(slotName); !ok {
		return nil, fmt.Errorf("node: sandbox %s: network slot %s is gone", id, slotName)
	}
	return inst, nil
}

// Freeze stops every process of a sandbox in place (its memory stays
// allocated); Thaw lets them run again. A paused sandbox is not frozen but
// kept on disk (PauseToDisk); freezing is how Snapshot holds it still.
func (n *Node) Freeze(ctx context.Context, inst *Instance) error {
	return n.cfg.Runtime.Pause(ctx, inst.ID)
}
func (n *Node) Thaw(ctx context.Context, inst *Instance) error {
	return n.cfg.Runtime.Resume(ctx, inst.ID)
}

// Stats reads a sandbox's resource use.
func (n *Node) Stats(ctx context.Context, inst *Instance) (runtime.Stats, error) {
	return n.cfg.Runtime.Stats(ctx, inst.ID)
}

// Checkpoint writes the sandbox's memory and process state into imageDir.
// With leaveRunning the sandbox keeps running (a snapshot).
func (n *Node) Checkpoint(ctx context.Context, inst *Instance, imageDir string, leaveRunning bool) error {
	return n.cfg.Runtime.Checkpoint(ctx, inst.ID, imageDir, leaveRunning)
}

// Restore starts a new sandbox from a checkpoint image, with a new slot
// and root filesystem, and returns once envd is healthy. The request must
// match the checkpointed sandbox's (same layers, user and workdir); with
// req.DiskImage (a Snapshot's) its writable layer is a copy of the
// checkpointed one's, else it starts empty.
func (n *Node) Restore(ctx context.Context, req CreateRequest, imageDir string) (_ *Instance, err error) {
	// Its /etc/hosts is written again, naming its own ID: the runtime
	// drops the sentry's cache of unused files at a checkpoint, so the
	// restored sandbox reads the new one.
	inst, spec, err := n.prepare(ctx, req, n.freshRoot(req), true, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.release(context.WithoutCancel(ctx), inst)
		}
	}()
	// The slot is fresh, so eth0 still has its address: gVisor needs it
	// there to restore (it takes it into its own stack on start).
	if err := n.cfg.Runtime.Restore(context.WithoutCancel(ctx), spec, imageDir); err != nil { // as in Create
		return nil, fmt.Errorf("node: restoring sandbox %s: %w", req.ID, err)
	}
	steptrace.From(ctx).Mark("runtime-restore")
	if err := n.waitHealthy(ctx, inst); err != nil {
		return nil, err
	}
	steptrace.From(ctx).Mark("envd-health")
	return inst, nil
}

// waitHealthy polls envd's /health until it answers 204.
func (n *Node) waitHealthy(ctx context.Context, inst *Instance) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.HealthTimeout)
	defer cancel()
	url := inst.EnvdURL() + "/health"
	// A short fixed interval: a refused connection costs microseconds, and
	// backing off would add up to a whole interval to every create.
	const interval = 3 * time.Millisecond
	var last error
	err := poll.Until(ctx, interval, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		res, err := n.client.Do(req)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusNoContent {
				return true, nil
			}
			err = fmt.Errorf("health answered %s", res.Status)
		}
		last = err
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node: envd of sandbox %s did not become healthy: %v", inst.ID, last)
	}
	return nil
}

// Cleanup removes what a crashed previous run left on this node:
// containers in the runtime's state, root filesystems and network slots of
// sandboxes that keep does not list. keep maps the IDs of sandboxes that
// live on (the store knows them) to their slots' namespace names.
func (n *Node) Cleanup(ctx context.Context, keep map[string]string) error {
	var errs []error
	containers, err := n.cfg.Runtime.List(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, c := range containers {
		if _, ok := keep[c.ID]; !ok {
			errs = append(errs, n.cfg.Runtime.Delete(ctx, c.ID))
		}
	}
	errs = append(errs, n.cfg.Rootfs.Cleanup(func(id string) bool { _, ok := keep[id]; return ok }))
	slots := map[string]bool{}
	for _, name := range keep {
		slots[name] = true
	}
	errs = append(errs, n.cfg.Network.Cleanup(func(name string) bool { return slots[name] }))
	return errors.Join(errs...)
}
