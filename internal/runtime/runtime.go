package runtime

import (
	"context"
	"errors"
)

// Runtime runs sandboxes: OCI containers whose first process is envd.
//
// # Terms
//
// A sandbox is named by an ID chosen by the caller (see ValidID). The caller
// owns everything a sandbox uses from the outside: the root filesystem (an
// overlay mount whose upper dir holds the sandbox's writes), the network
// namespace, the envd binary and bind-mounted volumes. The runtime owns the
// container: its processes, its cgroup (always <CgroupParent>/<id>, in every
// cgroup hierarchy, v1 or v2), its runtime state under Config.StateDir, and
// per-sandbox log files (envd's stdout/stderr, runtime logs).
//
// # States
//
//	created  The container exists (namespaces, cgroup) but its process has
//	         not started. Start and Restore never leave a sandbox here on
//	         success; it is seen only when one of them was interrupted.
//	running  envd and whatever it started are running.
//	paused   Every process is frozen (runc: cgroup freezer; runsc: the
//	         sentry stops all tasks). Memory stays allocated and charged;
//	         TCP peers see no answers but connections are kept.
//	stopped  The first process has exited (Kill, an OOM kill of envd, or
//	         Checkpoint without leaveRunning). Runtime state and the cgroup
//	         remain until Delete.
//
// A sandbox that was never started, or was deleted, has no state: methods
// given its ID return an error wrapping ErrNotFound, except Delete.
//
// # Methods by state
//
//	Start       (none)     → running. Creates and starts in one step. On
//	                         failure it removes what it created, so the ID
//	                         is free again.
//	Pause       running    → paused.   paused: no-op.  other: error.
//	Resume      paused     → running.  running: no-op. other: error.
//	Checkpoint  running    → running if leaveRunning, else stopped.
//	                         Writes a checkpoint image (below).
//	Restore     (none)     → running, from a checkpoint image, under a new
//	                         ID (or the old one after it was deleted).
//	Kill        running, paused, created → stopped; stopped: no-op. It
//	                         SIGKILLs every process of the sandbox and
//	                         returns once the first process is gone.
//	Delete      any state  → (none). Kills what still runs, removes the
//	                         runtime state, the cgroups and the logs.
//	                         Idempotent: deleting an unknown ID is not an
//	                         error, so it is safe in cleanup paths.
//	State, Stats  any state; Stats of a stopped sandbox reads whatever the
//	              cgroup still holds.
//	List        every sandbox under this runtime's state dir.
//
// # Checkpoint images
//
// A checkpoint image is a directory written by Checkpoint: the memory and
// kernel state of every process of the sandbox (for runsc: the whole
// sentry; for runc: CRIU's dump). It does not contain the root filesystem
// or volumes: rootfs writes live in the caller's overlay upper dir (runsc
// runs with --overlay2=none for exactly that reason), so the caller must
// keep (or copy) the upper dir as it was at checkpoint time, and give
// Restore a rootfs with that content. An image is opaque, only readable by
// the same runtime backend and binary version, and can be restored any
// number of times, each into a new ID, concurrently with the original
// (fork/clone). The restored sandbox must look like the checkpointed one:
// same envd path and arguments, same mount destinations and options; the
// ID, rootfs path, netns path, hostname, env and resources may differ.
// Environment variables in a Restore spec do not reach envd, which keeps
// the ones it had (including its access token).
//
// Implementations are safe for concurrent use on different IDs. Callers
// serialize operations on one ID.
type Runtime interface {
	// Name is the backend name: "runsc" or "runc".
	Name() string

	// Capabilities tells what this backend supports on this host.
	Capabilities() Capabilities

	// Start creates the sandbox described by spec and starts envd in it.
	Start(ctx context.Context, spec Spec) error

	// Pause freezes every process of a running sandbox.
	Pause(ctx context.Context, id string) error

	// Resume thaws a paused sandbox.
	Resume(ctx context.Context, id string) error

	// Checkpoint writes a checkpoint image of the sandbox into imageDir
	// (created if missing; it should be empty). With leaveRunning the
	// sandbox goes on running afterwards (a snapshot); without, it is
	// stopped and the caller deletes it. It fails with an error wrapping
	// ErrNotSupported when Capabilities().Checkpoint is false.
	Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error

	// Restore starts a new sandbox spec.ID from the checkpoint image in
	// imageDir. spec.NetNSPath must be configured (address, routes) like
	// the checkpointed sandbox's before the call. It fails with an error
	// wrapping ErrNotSupported when Capabilities().Checkpoint is false.
	Restore(ctx context.Context, spec Spec, imageDir string) error

	// Kill SIGKILLs every process of the sandbox and waits until the
	// first one is gone. The sandbox stays (stopped) until Delete.
	Kill(ctx context.Context, id string) error

	// Delete kills what still runs and removes every trace of the sandbox.
	Delete(ctx context.Context, id string) error

	// State reports the sandbox's state.
	State(ctx context.Context, id string) (State, error)

	// Foreground gives a sandbox started with Spec.Background the CPU
	// weight of every other sandbox.
	Foreground(id string) error

	// Stats reads the sandbox's resource usage from its cgroup.
	Stats(ctx context.Context, id string) (Stats, error)

	// List reports every sandbox this runtime knows, in no fixed order.
	List(ctx context.Context) ([]Container, error)

	// LogPath is the file envd's stdout and stderr go to while the
	// sandbox exists (Delete removes it), unless its Spec.LogPath named
	// another one, which is the caller's.
	LogPath(id string) string
}

// State is a sandbox's lifecycle state, as reported by the OCI runtime.
type State string

// The states of a sandbox; see Runtime.
const (
	StateCreated State = "created"
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped"
)

// Container is one entry of List.
type Container struct {
	ID    string
	State State
	// Pid is the host PID of the first process (runc) or of the gVisor
	// sandbox process (runsc); 0 once stopped.
	Pid int
}

// Stats is a sandbox's resource usage, read from its cgroup.
type Stats struct {
	// CPUUsageNs is the CPU time used since start, user and system, in
	// nanoseconds.
	CPUUsageNs uint64
	// MemoryBytes is the memory charged to the cgroup, page cache and
	// tmpfs included (what the memory limit is checked against).
	MemoryBytes uint64
	// MemoryLimitBytes is the cgroup's memory limit, 0 when unlimited.
	MemoryLimitBytes uint64
	// MemoryCacheBytes is the page cache part of MemoryBytes (memory.stat
	// "file" on cgroup v2, "cache" on v1).
	MemoryCacheBytes uint64
	// Pids is the number of host tasks in the cgroup. Under runc these are
	// the sandbox's threads and processes; under runsc they are the
	// sentry's and its systrap stubs', not the guest's processes.
	Pids uint64
}

// Capabilities tells what a backend can do on this host.
type Capabilities struct {
	// Checkpoint covers Checkpoint and Restore, including restoring one
	// image into several new sandboxes.
	Checkpoint bool
	// CheckpointDetail explains why Checkpoint is false, or names the
	// tool that provides it.
	CheckpointDetail string
	// Pause covers Pause and Resume.
	Pause bool
}

var (
	// ErrNotFound is wrapped by errors about an unknown sandbox ID.
	ErrNotFound = errors.New("sandbox not found")
	// ErrNotSupported is wrapped by errors about an operation the backend
	// cannot do on this host.
	ErrNotSupported = errors.New("not supported")
	// ErrExists is wrapped when Start or Restore is given an ID in use.
	ErrExists = errors.New("sandbox already exists")
)
