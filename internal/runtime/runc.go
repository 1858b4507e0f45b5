package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/steptrace"
)

// Runc is the runc backend: namespaces and cgroups on the host kernel,
// hardened like a Docker container (Docker's capability set and seccomp
// profile, masked and read-only /proc and /sys paths). The sandbox still
// shares the host kernel with the code it runs, which is why
// `warren serve` wants --insecure-runtime for it.
// Pause is the cgroup freezer; checkpoint/restore is CRIU's, available
// only when a CRIU >= 4.2 is installed.
type Runc struct {
	*base
	criu       string // CRIU path, "" when checkpointing is unsupported
	criuDetail string
	seccomp    *specs.LinuxSeccomp
}

var _ Runtime = (*Runc)(nil)

// NewRunc returns the runc backend. It fails if runc is not installed.
func NewRunc(cfg Config) (*Runc, error) {
	if cfg.Binary == "" {
		cfg.Binary = "runc"
	}
	p, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("runtime: runc not found (%v); `warren setup` installs it", err)
	}
	cfg.Binary = p
	cfg, err = cfg.withDefaults("runc")
	if err != nil {
		return nil, err
	}
	b, err := newBase("runc", cfg)
	if err != nil {
		return nil, err
	}
	sc, err := sandboxSeccomp()
	if err != nil {
		return nil, err
	}
	r := &Runc{base: b, seccomp: sc}
	path, ok, detail := criuStatus(cfg.CriuPath)
	r.criuDetail = detail
	if ok {
		r.criu = path
	}
	return r, nil
}

// Name implements Runtime.
func (r *Runc) Name() string { return "runc" }

// Capabilities implements Runtime.
func (r *Runc) Capabilities() Capabilities {
	return Capabilities{Checkpoint: r.criu != "", CheckpointDetail: r.criuDetail, Pause: true}
}

// exists looks at runc's state directory: runc keeps <root>/<id>/state.json.
func (r *Runc) exists(id string) bool {
	_, err := os.Stat(filepath.Join(r.rootDir(), id, "state.json"))
	return err == nil
}

// global returns runc's global flags for a per-sandbox command.
func (r *Runc) global(id string) []string {
	return []string{"--root", r.rootDir(), "--log", r.errLog(id), "--log-format", "json"}
}

func (r *Runc) ociOptions(s *Spec) ociOptions {
	pids := s.PidsLimit
	if pids == 0 {
		pids = r.cfg.PidsLimit
	}
	return ociOptions{cgroupNS: true, maskHost: true, pidsLimit: pids, seccomp: r.seccomp}
}

// Start implements Runtime.
func (r *Runc) Start(ctx context.Context, spec Spec) error {
	if err := spec.validate(); err != nil {
		return err
	}
	if r.exists(spec.ID) {
		return fmt.Errorf("runc start %s: %w", spec.ID, ErrExists)
	}
	logf, err := r.prepare(&spec, r.ociOptions(&spec))
	if err != nil {
		return fmt.Errorf("runc start %s: %w", spec.ID, err)
	}
	defer logf.Close()
	steptrace.From(ctx).Mark("runtime-bundle")
	// No terminal and --detach: runc hands its own stdio to envd, so
	// envd's output lands in envd.log and nothing ties envd to us.
	args := append(r.global(spec.ID), "run", "--detach", "--bundle", r.sandboxDir(spec.ID), spec.ID)
	if _, err := r.cli.run(ctx, spec.ID, call{args: args, stdio: logf, errLog: r.errLog(spec.ID)}); err != nil {
		undo(r, r.cfg.CommandTimeout, spec.ID)
		return err
	}
	return nil
}

// Pause implements Runtime.
func (r *Runc) Pause(ctx context.Context, id string) error {
	return r.simple(ctx, id, "pause", StatePaused)
}

// Resume implements Runtime.
func (r *Runc) Resume(ctx context.Context, id string) error {
	return r.simple(ctx, id, "resume", StateRunning)
}

// simple runs a state-changing command; if it fails because the sandbox
// is already in the target state, that is success (idempotence costs a
// state query only on the error path).
func (r *Runc) simple(ctx context.Context, id, cmd string, target State) error {
	if !r.exists(id) {
		return notFound("runc", cmd, id)
	}
	_, err := r.cli.run(ctx, id, call{args: append(r.global(id), cmd, id)})
	if err != nil && isCommandError(err) {
		if st, serr := r.State(ctx, id); serr == nil && st == target {
			return nil
		}
	}
	return err
}

// Kill implements Runtime. It SIGKILLs the sandbox's init: the kernel then
// kills every other process of its PID namespace before init is reaped,
// so the pidfd poll returns once the whole sandbox is gone. This avoids
// `runc delete --force`, which spends ~100 ms in a kill-and-poll loop.
func (r *Runc) Kill(ctx context.Context, id string) error {
	st, pid, err := r.stateAndPid(ctx, id)
	if err != nil {
		return err
	}
	if st == StateStopped {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	w, alive, err := watchPid(pid)
	if err != nil {
		return fmt.Errorf("runc kill %s: %w", id, err)
	}
	if !alive {
		return nil
	}
	defer w.close()
	if err := w.kill(); err != nil {
		return fmt.Errorf("runc kill %s: %w", id, err)
	}
	if st == StatePaused {
		// Frozen tasks (cgroup v1 freezer) only die once thawed.
		if _, err := r.cli.run(ctx, id, call{args: append(r.global(id), "resume", id)}); err != nil {
			return err
		}
	}
	if err := w.wait(ctx); err != nil {
		return fmt.Errorf("runc kill %s: waiting for pid %d: %w", id, pid, err)
	}
	return nil
}

func (r *Runc) stateAndPid(ctx context.Context, id string) (State, int, error) {
	if !r.exists(id) {
		return "", 0, notFound("runc", "state", id)
	}
	st, err := r.state(ctx, id, id)
	if err != nil {
		return "", 0, err
	}
	return State(st.Status), st.Pid, nil
}

// Delete implements Runtime.
func (r *Runc) Delete(ctx context.Context, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("runc delete: invalid sandbox id %q", id)
	}
	var errs []error
	if r.exists(id) {
		if err := r.Kill(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
		// The sandbox is stopped now, so --force only matters if Kill
		// failed; it does not poll on a stopped container.
		if _, err := r.cli.run(ctx, id, call{args: []string{"--root", r.rootDir(), "delete", "--force", id}}); err != nil && r.exists(id) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, r.cleanup(ctx, id))
	return errors.Join(errs...)
}

// State implements Runtime.
func (r *Runc) State(ctx context.Context, id string) (State, error) {
	st, _, err := r.stateAndPid(ctx, id)
	return st, err
}

// Stats implements Runtime.
func (r *Runc) Stats(ctx context.Context, id string) (Stats, error) {
	if !r.exists(id) {
		return Stats{}, notFound("runc", "stats", id)
	}
	return r.stats(id)
}

// List implements Runtime.
func (r *Runc) List(ctx context.Context) ([]Container, error) { return r.list(ctx) }

// Checkpoint implements Runtime with CRIU. The image goes to imageDir;
// CRIU's work files and log go to the sandbox directory.
func (r *Runc) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	if r.criu == "" {
		return fmt.Errorf("%w (%s)", errRuncNoCheckpoint, r.criuDetail)
	}
	if !r.exists(id) {
		return notFound("runc", "checkpoint", id)
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return err
	}
	work := filepath.Join(r.sandboxDir(id), "criu-work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	args := append(r.global(id), "--criu", r.criu, "checkpoint", "--image-path", imageDir, "--work-path", work)
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	_, err := r.cli.run(ctx, id, call{args: append(args, id), errLog: r.errLog(id)})
	return err
}

// Restore implements Runtime with CRIU.
//
// Untested on the development hosts (their CRIU is too old). A known gap:
// CRIU reopens envd's stdout/stderr by path, i.e. the checkpointed
// sandbox's envd.log, which must still exist with the size it had.
func (r *Runc) Restore(ctx context.Context, spec Spec, imageDir string) error {
	if r.criu == "" {
		return fmt.Errorf("%w (%s)", errRuncNoCheckpoint, r.criuDetail)
	}
	if err := spec.validate(); err != nil {
		return err
	}
	if r.exists(spec.ID) {
		return fmt.Errorf("runc restore %s: %w", spec.ID, ErrExists)
	}
	if _, err := os.Stat(imageDir); err != nil {
		return fmt.Errorf("runc restore %s: image: %w", spec.ID, err)
	}
	logf, err := r.prepare(&spec, r.ociOptions(&spec))
	if err != nil {
		return fmt.Errorf("runc restore %s: %w", spec.ID, err)
	}
	defer logf.Close()
	work := filepath.Join(r.sandboxDir(spec.ID), "criu-work")
	if err := os.MkdirAll(work, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	args := append(r.global(spec.ID), "--criu", r.criu, "restore", "--detach",
		"--image-path", imageDir, "--work-path", work, "--bundle", r.sandboxDir(spec.ID), spec.ID)
	if _, err := r.cli.run(ctx, spec.ID, call{args: args, stdio: logf, errLog: r.errLog(spec.ID)}); err != nil {
		undo(r, r.cfg.CommandTimeout, spec.ID)
		return err
	}
	return nil
}
