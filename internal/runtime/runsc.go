package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/warren-sandbox/warren/internal/steptrace"
)

// Runsc is the gVisor backend. Each sandbox is one gVisor sandbox: a
// sentry process (the guest kernel, in user space) plus a gofer serving
// its filesystem, both in the sandbox's cgroup.
//
// Flags, chosen once for every command (a restore must boot with the
// flags of the checkpointed sandbox):
//
//	--platform=systrap   kvm hangs on hosts whose /dev/kvm is PVM.
//	--network=sandbox    gVisor's own network stack on the netns's veth.
//	--overlay2=none      rootfs writes go straight to Spec.RootFS, i.e. to
//	                     the caller's overlay upper dir on the host, where a
//	                     disk quota applies and where the image code can
//	                     snapshot them. gVisor's default (root:self) would
//	                     keep them in a hidden filestore file inside the
//	                     rootfs and in checkpoint images instead.
//	--allow-suid         sudo must work; gVisor ignores setuid bits
//	                     otherwise. no_new_privileges stays false.
//	--ignore-cgroups=false  limits and Stats come from the host cgroup.
//
// Limits: memory and CPU are the host cgroup's; gVisor also sizes the
// guest's memory and CPU count from them. Tasks are different: guest
// processes are not host tasks, so the host pids cgroup only bounds the
// sentry's threads and systrap's stub processes. gVisor has no pids limit
// of its own, so the pids limit is applied to the host cgroup scaled by
// runscPidsFactor: coarse (it counts host tasks, not guest ones) but it
// stops a fork bomb from exhausting host PIDs.
//
// Memory: every guest page lives in the sentry's memory file, so when the
// guest exceeds MemoryMB the host OOM killer's biggest process is the
// sentry: the whole sandbox dies (State reports stopped) instead of one
// guest process, as it would under runc. gVisor has no guest OOM killer.
type Runsc struct {
	*base
}

var _ Runtime = (*Runsc)(nil)

// runscPidsFactor and runscPidsBase turn a guest pids limit into a host
// one. Measured: an idle sandbox has ~25 host tasks (sentry and gofer
// threads), and each guest process adds ~2.2 (its systrap stub process and
// thread). The factor leaves headroom for multi-threaded guests.
const (
	runscPidsFactor = 3
	runscPidsBase   = 128
)

// NewRunsc returns the gVisor backend. It fails if the runsc binary is
// missing; `warren setup` (EnsureRunsc) installs it.
func NewRunsc(cfg Config) (*Runsc, error) {
	if cfg.Binary == "" {
		cfg.Binary = DefaultRunscPath
	}
	if fi, err := os.Stat(cfg.Binary); err != nil || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("runtime: runsc not found at %s; `warren setup` builds it", cfg.Binary)
	}
	cfg, err := cfg.withDefaults("runsc")
	if err != nil {
		return nil, err
	}
	b, err := newBase("runsc", cfg)
	if err != nil {
		return nil, err
	}
	return &Runsc{base: b}, nil
}

// Name implements Runtime.
func (r *Runsc) Name() string { return "runsc" }

// Capabilities implements Runtime.
func (r *Runsc) Capabilities() Capabilities {
	return Capabilities{Checkpoint: true, CheckpointDetail: "gVisor native checkpoint/restore", Pause: true}
}

// runscIDSuffix ends every container ID we give runsc. runsc resolves
// IDs by prefix: `runsc delete sb-1` deletes sb-12 if sb-1 does not exist,
// and fails as "ambiguous" if both do. '+' is valid in runsc IDs but not in
// ours (ValidID), so "<a>+" is never a prefix of "<b>+" unless a == b.
const runscIDSuffix = "+"

// rid is the runsc container (and sandbox) ID of sandbox id.
func rid(id string) string { return id + runscIDSuffix }

// exists checks for the exact state file of a root container, before any
// runsc call naming a sandbox (see runscIDSuffix).
func (r *Runsc) exists(id string) bool {
	_, err := os.Stat(filepath.Join(r.rootDir(), rid(id)+"_sandbox:"+rid(id)+".state"))
	return err == nil
}

// flags are the global flags of every runsc call.
func (r *Runsc) flags() []string {
	return []string{
		"--root", r.rootDir(),
		"--platform=systrap",
		"--network=sandbox",
		"--overlay2=none",
		"--allow-suid",
		"--ignore-cgroups=false",
	}
}

// global adds the per-sandbox logs to flags.
func (r *Runsc) global(id string) []string {
	f := append(r.flags(),
		"--log", r.errLog(id), "--log-format", "json",
		"--debug-log", filepath.Join(r.sandboxDir(id), "runsc.%COMMAND%.log"))
	if r.cfg.Debug {
		f = append(f, "--debug")
	}
	return append(f, r.cfg.RunscFlags...) // last: they override
}

func (r *Runsc) ociOptions(s *Spec) ociOptions {
	pids := s.PidsLimit
	if pids == 0 {
		pids = r.cfg.PidsLimit
	}
	if pids > 0 {
		pids = pids*runscPidsFactor + runscPidsBase
	}
	return ociOptions{pidsLimit: pids, diskTmp: true}
}

// Start implements Runtime.
func (r *Runsc) Start(ctx context.Context, spec Spec) error {
	return r.boot(ctx, spec, "run")
}

// Restore implements Runtime. The image can be restored any number of
// times, into new IDs, while the checkpointed sandbox keeps running.
func (r *Runsc) Restore(ctx context.Context, spec Spec, imageDir string) error {
	if _, err := os.Stat(filepath.Join(imageDir, "checkpoint.img")); err != nil {
		return fmt.Errorf("runsc restore %s: not a checkpoint image: %w", spec.ID, err)
	}
	return r.boot(ctx, spec, "restore", "--image-path", imageDir)
}

// boot runs `runsc run` or `runsc restore`, detached, with envd.log as
// the sandbox's stdio.
func (r *Runsc) boot(ctx context.Context, spec Spec, cmd string, extra ...string) error {
	if err := spec.validate(); err != nil {
		return err
	}
	if r.exists(spec.ID) {
		return fmt.Errorf("runsc %s %s: %w", cmd, spec.ID, ErrExists)
	}
	logf, err := r.prepare(&spec, r.ociOptions(&spec))
	if err != nil {
		return fmt.Errorf("runsc %s %s: %w", cmd, spec.ID, err)
	}
	defer logf.Close()
	steptrace.From(ctx).Mark("runtime-bundle")
	args := append(r.global(spec.ID), cmd, "--detach", "--bundle", r.sandboxDir(spec.ID))
	args = append(append(args, extra...), rid(spec.ID))
	if _, err := r.cli.run(ctx, spec.ID, call{args: args, stdio: logf, errLog: r.errLog(spec.ID)}); err != nil {
		undo(r, r.cfg.CommandTimeout, spec.ID)
		return err
	}
	return nil
}

// Pause implements Runtime.
func (r *Runsc) Pause(ctx context.Context, id string) error {
	return r.simple(ctx, id, "pause", StatePaused)
}

// Resume implements Runtime.
func (r *Runsc) Resume(ctx context.Context, id string) error {
	return r.simple(ctx, id, "resume", StateRunning)
}

func (r *Runsc) simple(ctx context.Context, id, cmd string, target State) error {
	if !r.exists(id) {
		return notFound("runsc", cmd, id)
	}
	_, err := r.cli.run(ctx, id, call{args: append(r.global(id), cmd, rid(id))})
	if err != nil && isCommandError(err) {
		if st, serr := r.State(ctx, id); serr == nil && st == target {
			return nil
		}
	}
	return err
}

// Checkpoint implements Runtime. The image is uncompressed (gVisor's
// default): compression costs more time than the disk it saves here.
func (r *Runsc) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	if !r.exists(id) {
		return notFound("runsc", "checkpoint", id)
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return err
	}
	args := append(r.global(id), "checkpoint", "--image-path", imageDir)
	if leaveRunning {
		args = append(args, "--leave-running")
		_, err := r.cli.run(ctx, id, call{args: append(args, rid(id))})
		return err
	}
	// Without --leave-running the sentry exits after the image is written,
	// but runsc returns before it has: wait for it, so that the sandbox is
	// stopped when Checkpoint returns, as the interface promises.
	st, err := r.sandboxState(ctx, id)
	if err != nil {
		return err
	}
	w, alive, err := watchPid(st.Pid)
	if err != nil {
		return err
	}
	defer w.close()
	if _, err := r.cli.run(ctx, id, call{args: append(args, rid(id))}); err != nil {
		return err
	}
	if !alive {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	if err := w.wait(wctx); err != nil {
		return fmt.Errorf("runsc checkpoint %s: waiting for the sandbox to stop: %w", id, err)
	}
	return nil
}

// Kill implements Runtime. The sentry is the sandbox: SIGKILL to the
// sentry's host process ends every guest process at once, works the same
// when the sandbox is paused (its tasks are stopped inside the sentry, and
// a signal through `runsc kill` would wait for a resume), and the gofer
// exits when the sentry is gone.
func (r *Runsc) Kill(ctx context.Context, id string) error {
	if !r.exists(id) {
		return notFound("runsc", "kill", id)
	}
	st, err := r.sandboxState(ctx, id)
	if err != nil {
		return err
	}
	if State(st.Status) == StateStopped {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	if err := killAndWait(ctx, st.Pid); err != nil {
		return fmt.Errorf("runsc kill %s: %w", id, err)
	}
	return nil
}

// Delete implements Runtime.
func (r *Runsc) Delete(ctx context.Context, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("runsc delete: invalid sandbox id %q", id)
	}
	var errs []error
	if r.exists(id) {
		if err := r.Kill(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
		// -force: also reaps a sandbox whose Kill failed; on a stopped one
		// it just removes the state and the gofer's leftovers.
		if _, err := r.cli.run(ctx, id, call{args: append(r.flags(), "delete", "--force", rid(id))}); err != nil && r.exists(id) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, r.cleanup(ctx, id))
	return errors.Join(errs...)
}

// State implements Runtime.
func (r *Runsc) State(ctx context.Context, id string) (State, error) {
	if !r.exists(id) {
		return "", notFound("runsc", "state", id)
	}
	st, err := r.sandboxState(ctx, id)
	return State(st.Status), err
}

// sandboxState is runsc's state, corrected for a dead sentry: runsc
// checks liveness with kill(pid, 0), which succeeds on a zombie, and a
// sentry that died (OOM kill) stays a zombie until whoever inherited it
// reaps it, which a non-init PID 1 may never do.
func (r *Runsc) sandboxState(ctx context.Context, id string) (ociState, error) {
	st, err := r.state(ctx, id, rid(id))
	if err == nil && State(st.Status) != StateStopped && !processAlive(st.Pid) {
		st.Status, st.Pid = string(StateStopped), 0
	}
	return st, err
}

// List implements Runtime.
func (r *Runsc) List(ctx context.Context) ([]Container, error) {
	all, err := r.list(ctx)
	var cs []Container
	for _, c := range all {
		id, ours := strings.CutSuffix(c.ID, runscIDSuffix)
		if !ours {
			continue
		}
		c.ID = id
		if c.State != StateStopped && !processAlive(c.Pid) {
			c.State, c.Pid = StateStopped, 0
		}
		cs = append(cs, c)
	}
	return cs, err
}

// Stats implements Runtime.
func (r *Runsc) Stats(ctx context.Context, id string) (Stats, error) {
	if !r.exists(id) {
		return Stats{}, notFound("runsc", "stats", id)
	}
	return r.stats(id)
}
