package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// base is what both backends share: the state layout, the CLI calls every
// OCI runtime has in common (state, list, delete), cgroup access.
//
// Layout under Config.StateDir:
//
//	state/                 the runtime's --root
//	sandboxes/<id>/        one per sandbox, removed by Delete:
//	  config.json          the OCI bundle (root.path points at Spec.RootFS)
//	  envd.log             envd's stdout and stderr, unless Spec.LogPath
//	                       puts them elsewhere
//	  runtime.log          the runtime's errors (--log, JSON lines)
//	  runsc.<cmd>.log      runsc's own logs (--debug-log)
type base struct {
	name    string
	cfg     Config
	cli     cli
	cgroups *cgroupMounts
}

func newBase(name string, cfg Config) (*base, error) {
	cg, err := readCgroupMounts()
	if err != nil {
		return nil, fmt.Errorf("runtime: reading cgroup mounts: %w", err)
	}
	b := &base{name: name, cfg: cfg, cli: cli{bin: cfg.Binary, timeout: cfg.CommandTimeout}, cgroups: cg}
	for _, d := range []string{b.rootDir(), filepath.Join(cfg.StateDir, "sandboxes")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runtime: %w", err)
		}
	}
	return b, nil
}

func (b *base) rootDir() string             { return filepath.Join(b.cfg.StateDir, "state") }
func (b *base) sandboxDir(id string) string { return filepath.Join(b.cfg.StateDir, "sandboxes", id) }
func (b *base) LogPath(id string) string    { return filepath.Join(b.sandboxDir(id), "envd.log") }
func (b *base) errLog(id string) string     { return filepath.Join(b.sandboxDir(id), "runtime.log") }
func (b *base) cgroupPath(id string) string { return cgroupPath(&b.cfg, id) }

// prepare writes the bundle of a new sandbox and opens envd's log file.
// A sandbox directory left over from a crashed run is replaced.
func (b *base) prepare(spec *Spec, o ociOptions) (*os.File, error) {
	if err := b.claimCgroup(spec.ID); err != nil {
		return nil, err
	}
	dir := b.sandboxDir(spec.ID)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(buildOCI(spec, &b.cfg, o), "", "\t")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return nil, err
	}
	logPath := spec.LogPath
	if logPath == "" {
		logPath = b.LogPath(spec.ID)
	}
	return os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
}

// claimCgroup makes sure the sandbox's cgroup does not exist yet. A
// leftover one (from a crashed warren, or a runtime state dir that was
// wiped) is removed if empty; one that still has processes is refused: the
// new sandbox would share their limits and Delete would kill them.
func (b *base) claimCgroup(id string) error {
	if len(cgroupLeftovers(b.cgroups, b.cgroupPath(id))) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := removeCgroups(ctx, b.cgroups, b.cgroupPath(id)); err != nil {
		return fmt.Errorf("cgroup %s is still in use by processes of an unknown sandbox: %w", b.cgroupPath(id), ErrExists)
	}
	return nil
}

// ociState is what `state` and `list --format json` print (both runtimes
// print at least the OCI state fields).
type ociState struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

// state asks the runtime about sandbox id, known to the runtime as
// runtimeID; callers have checked the sandbox exists.
func (b *base) state(ctx context.Context, id, runtimeID string) (ociState, error) {
	out, err := b.cli.run(ctx, id, call{args: []string{"--root", b.rootDir(), "state", runtimeID}})
	if err != nil {
		return ociState{}, err
	}
	var st ociState
	if err := json.Unmarshal(out, &st); err != nil {
		return ociState{}, fmt.Errorf("%s state %s: %w", b.name, id, err)
	}
	return st, nil
}

func (b *base) list(ctx context.Context) ([]Container, error) {
	out, err := b.cli.run(ctx, "", call{args: []string{"--root", b.rootDir(), "list", "--format", "json"}})
	if err != nil {
		return nil, err
	}
	var sts []ociState
	if err := json.Unmarshal(out, &sts); err != nil {
		return nil, fmt.Errorf("%s list: %w", b.name, err)
	}
	cs := make([]Container, 0, len(sts))
	for _, st := range sts {
		cs = append(cs, Container{ID: st.ID, State: State(st.Status), Pid: st.Pid})
	}
	return cs, nil
}

// Foreground implements Runtime.
func (b *base) Foreground(id string) error {
	if !ValidID(id) {
		return fmt.Errorf("runtime: invalid sandbox id %q", id)
	}
	dir, v2, ok := b.cgroups.dir("cpu", b.cgroupPath(id))
	if !ok {
		return nil // no CPU controller, so no weights either
	}
	file, value := "cpu.shares", defaultShares
	if v2 {
		file, value = "cpu.weight", defaultWeight
	}
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY, 0)
	if v2 && errors.Is(err, fs.ErrNotExist) {
		return nil // the cpu controller is not enabled there: no weights
	}
	if err == nil {
		_, err = f.WriteString(strconv.Itoa(value))
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return fmt.Errorf("runtime: the CPU weight of %s: %w", id, err)
	}
	return nil
}

func (b *base) stats(id string) (Stats, error) {
	st, err := readStats(b.cgroups, b.cgroupPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return st, fmt.Errorf("%s stats %s: %w: no cgroup", b.name, id, ErrNotFound)
	}
	return st, err
}

// cleanup removes what Delete must not leave behind even when the runtime
// forgot it or was never told: the cgroups and the sandbox directory.
func (b *base) cleanup(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return errors.Join(
		removeCgroups(ctx, b.cgroups, b.cgroupPath(id)),
		os.RemoveAll(b.sandboxDir(id)),
	)
}

func notFound(backend, op, id string) error {
	return fmt.Errorf("%s %s %s: %w", backend, op, id, ErrNotFound)
}

// undo removes a sandbox whose start or restore failed half-way, even when
// the caller's context is already done.
func undo(rt Runtime, timeout time.Duration, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = rt.Delete(ctx, id)
}
