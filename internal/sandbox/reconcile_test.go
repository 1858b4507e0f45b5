package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// A sandbox whose runsc sandbox process is killed from the host (an OOM
// kill, an operator's kill -9) is noticed by the reconciler: its record
// goes (a GET answers 404), and everything it held on the node is
// released. Its neighbour runs on.
func TestReconcilerRemovesASandboxWhoseRuntimeDied(t *testing.T) {
	st := newStore(t)
	e := startRunsc(t, st, Config{ReconcileInterval: 200 * time.Millisecond})
	defer e.destroy()
	ctx := context.Background()
	victim, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	neighbour, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if out := run(t, e.mgr, victim, "echo ok"); strings.TrimSpace(out) != "ok" {
		t.Fatalf("before the kill: %q", out)
	}
	l, err := e.mgr.lookup(store.AllTeams(), victim.ID)
	if err != nil {
		t.Fatal(err)
	}
	inst := e.mgr.instance(l)
	slot := *inst.Slot

	pid := sandboxPid(t, e, victim.ID)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
	if !poll.Within(15*time.Second, 50*time.Millisecond, func() bool {
		_, err := st.GetSandbox(ctx, victim.ID)
		return errors.Is(err, store.ErrNotFound)
	}) {
		rec, _ := st.GetSandbox(ctx, victim.ID)
		t.Fatalf("15 s after its runsc sandbox process was killed the store still has it %s", rec.State)
	}
	if _, err := e.mgr.Get(ctx, team.MustParse("t1"), victim.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of the dead sandbox: %v, want ErrNotFound", err)
	}

	// Nothing of it is left on the node.
	if _, err := e.mgr.cfg.Node.Runtime().State(ctx, victim.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("its container is left: %v", err)
	}
	if _, err := os.Stat(slot.NetNSPath); !os.IsNotExist(err) {
		t.Errorf("its network namespace %s is left: %v", slot.NetNSPath, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", slot.HostVeth)); !os.IsNotExist(err) {
		t.Errorf("its veth %s is left: %v", slot.HostVeth, err)
	}
	mounts, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if strings.Contains(m.MountPoint, victim.ID) {
			t.Errorf("a mount of it is left: %s", m.MountPoint)
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range loops {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), victim.ID) {
			t.Errorf("a loop device of it is left: %s → %s", f, strings.TrimSpace(string(b)))
		}
	}
	for _, cg := range []string{"/sys/fs/cgroup/warren-sandbox-test/" + victim.ID, "/sys/fs/cgroup/memory/warren-sandbox-test/" + victim.ID} {
		if _, err := os.Stat(cg); !os.IsNotExist(err) {
			t.Errorf("its cgroup %s is left: %v", cg, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", victim.ID)); !os.IsNotExist(err) {
		t.Errorf("its root filesystem is left: %v", err)
	}
	if got, err := e.mgr.Get(ctx, team.MustParse("t1"), neighbour.ID); err != nil || got.State != store.StateRunning {
		t.Fatalf("the neighbour: %+v %v", got, err)
	}
	if out := run(t, e.mgr, neighbour, "echo ok"); strings.TrimSpace(out) != "ok" {
		t.Errorf("the neighbour after the kill: %q", out)
	}
}

// sandboxPid is the pid of the runtime's process of sandbox id (for
// runsc, its runsc-sandbox process).
func sandboxPid(t *testing.T, e *env, id string) int {
	t.Helper()
	cs, err := e.mgr.cfg.Node.Runtime().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.ID == id && c.Pid > 0 {
			return c.Pid
		}
	}
	t.Fatalf("the runtime lists no process of %s: %+v", id, cs)
	return 0
}

// A warm sandbox whose runsc process dies (killed from the host, OOM)
// while nobody has claimed it is discarded by the reconciler and
// replaced: a create never claims a dead one.
func TestReconcilerReplacesADeadWarmSandbox(t *testing.T) {
	e := startWith(t, newStore(t), Config{PoolSize: 1, ReconcileInterval: 200 * time.Millisecond}, envOptions{runtime: "runsc", tuning: &testTuning})
	defer e.destroy()
	// readyID is the pool's ready warm sandbox, "" for none (taken out
	// and put back: the test makes no creates meanwhile).
	readyID := func() string {
		e.mgr.mu.Lock()
		defer e.mgr.mu.Unlock()
		p := e.mgr.pools[baseimage.TemplateID]
		if p == nil {
			return ""
		}
		select {
		case w := <-p.ready:
			p.ready <- w
			return w.inst.ID
		default:
			return ""
		}
	}
	var dead string
	if !poll.Within(60*time.Second, 50*time.Millisecond, func() bool { dead = readyID(); return dead != "" }) {
		t.Fatal("the pool never had a warm sandbox ready")
	}
	if err := syscall.Kill(sandboxPid(t, e, dead), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var replacement string
	if !poll.Within(30*time.Second, 50*time.Millisecond, func() bool {
		replacement = readyID()
		return replacement != "" && replacement != dead
	}) {
		t.Fatalf("30 s after its runsc process was killed, the pool still holds %s (ready: %q)", dead, readyID())
	}
	if _, err := e.mgr.cfg.Node.Runtime().State(context.Background(), dead); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("the dead warm sandbox's container is left: %v", err)
	}
	rec, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if out := run(t, e.mgr, rec, "echo ok"); strings.TrimSpace(out) != "ok" {
		t.Errorf("a create after the warm sandbox died: %q", out)
	}
}
