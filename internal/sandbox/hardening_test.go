package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// TestAdmissionArithmetic checks the nominal accounting without a node:
// live, starting and warm sandboxes all count.
func TestAdmissionArithmetic(t *testing.T) {
	m := &Manager{
		cfg: Config{MaxSandboxes: 100, NodeCPUs: 2, NodeMemoryMB: 1000, CPUOvercommit: 2, MemoryOvercommit: 1.5,
			Resources: Resources{CPUCount: 1, MemoryMB: 200}},
		live:    map[string]*live{"a": {cpuCount: 1, memoryMB: 500}},
		perTeam: map[string]int{},
		pools:   map[string]*pool{"base": {floor: 2, res: Resources{CPUCount: 1, MemoryMB: 200}, ready: make(chan *warm, 2), building: 1}},
	}
	// Held: 500 live + 200 warming = 700 MB of 1500; 2 of 4 CPUs.
	if err := m.fitsLocked(Resources{CPUCount: 2, MemoryMB: 800}); err != nil {
		t.Errorf("a sandbox that fits exactly: %v", err)
	}
	err := m.fitsLocked(Resources{CPUCount: 1, MemoryMB: 801})
	if !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("one MB too many: %v", err)
	}
	err = m.fitsLocked(Resources{CPUCount: 3, MemoryMB: 128})
	if !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "CPU") {
		t.Errorf("one CPU too many: %v", err)
	}
	if _, err := m.reserve("t1", Resources{CPUCount: 2, MemoryMB: 800}); err != nil {
		t.Fatal(err)
	}
	if err := m.fitsLocked(Resources{CPUCount: 1, MemoryMB: 1}); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("a starting sandbox is not counted: %v", err)
	}
	m.unreserve("t1", Resources{CPUCount: 2, MemoryMB: 800})
	if u := m.usedLocked(); u != (usage{sandboxes: 2, cpus: 2, memoryMB: 700}) {
		t.Errorf("after unreserve: %+v", u)
	}
	if err := m.withinNode(Resources{CPUCount: 3, MemoryMB: 128}); !errors.Is(err, ErrInvalid) {
		t.Errorf("more CPUs than the node has: %v", err)
	}
	if err := m.withinNode(Resources{CPUCount: 1, MemoryMB: 256 << 10}); !errors.Is(err, ErrInvalid) {
		t.Errorf("256 GiB on a 1000 MB node: %v", err)
	}
}

func TestAdmissionByMemoryAndCPU(t *testing.T) {
	// Sandboxes of 1 CPU and 256 MB (start's Resources) on a node said to
	// have 600 MB (no overcommit): two fit, the third is refused.
	e := start(t, newStore(t), Config{NodeCPUs: 64, NodeMemoryMB: 600, MemoryOvercommit: 1})
	defer e.destroy()
	for range 2 {
		if _, err := e.create(CreateRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.create(CreateRequest{})
	if !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("a third 256 MB sandbox on 600 MB: %v", err)
	}
	if live, _ := e.mgr.Count(); live != 2 {
		t.Errorf("%d live sandboxes, want 2", live)
	}
	// A template asking more than the whole node has is invalid, not busy.
	e.mgr.cfg.Resolve = func(ctx context.Context, teamID, ref string) (Template, error) {
		tmpl, err := e.mgr.cfg.Images.Template(baseimage.TemplateID)
		return Template{ID: "big", Alias: "big", Image: tmpl, MemoryMB: 256 << 10}, err
	}
	if _, err := e.create(CreateRequest{TemplateID: "big"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "more than this node has") {
		t.Errorf("a 256 GiB template: %v", err)
	}
}

func TestAdmissionByCPU(t *testing.T) {
	e := start(t, newStore(t), Config{NodeCPUs: 1, NodeMemoryMB: 1 << 20, CPUOvercommit: 2})
	defer e.destroy()
	for range 2 {
		if _, err := e.create(CreateRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.create(CreateRequest{}); !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "CPU") {
		t.Errorf("a third 1-CPU sandbox on 1 CPU × 2: %v", err)
	}
}

func TestWarmPoolIsAdmittedToo(t *testing.T) {
	// Room for one 256 MB sandbox: the pool of 2 starts only one.
	e := start(t, newStore(t), Config{PoolSize: 2, NodeCPUs: 64, NodeMemoryMB: 300, MemoryOvercommit: 1})
	defer e.destroy()
	e.waitWarm(1)
	time.Sleep(2 * time.Second) // the filler retries every second
	e.mgr.mu.Lock()
	u := e.mgr.usedLocked()
	e.mgr.mu.Unlock()
	if u.sandboxes != 1 || u.memoryMB != 256 {
		t.Errorf("the pool holds %+v, want one 256 MB sandbox", u)
	}
	// The warm one can still be claimed: that starts nothing new.
	if _, err := e.create(CreateRequest{}); err != nil {
		t.Errorf("claiming the warm sandbox on a full node: %v", err)
	}
}

// hookStore calls before on every sandbox update, with the states before
// and after it; an error from before fails the update.
type hookStore struct {
	store.Store
	mu     sync.Mutex
	before func(id string, from, to store.SandboxState) error
}

func (h *hookStore) UpdateSandbox(ctx context.Context, id string, update func(*store.Sandbox) error) (store.Sandbox, error) {
	return h.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		from := s.State
		if err := update(s); err != nil {
			return err
		}
		h.mu.Lock()
		hook := h.before
		h.mu.Unlock()
		if hook != nil {
			return hook(id, from, s.State)
		}
		return nil
	})
}

func (h *hookStore) set(f func(id string, from, to store.SandboxState) error) {
	h.mu.Lock()
	h.before = f
	h.mu.Unlock()
}

func runtimeState(t *testing.T, e *env, id string) runtime.State {
	st, err := e.mgr.cfg.Node.Runtime().State(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestPausedSandboxesAreReaped(t *testing.T) {
	st := newStore(t)
	var logs strings.Builder
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	e := start(t, st, Config{ReapInterval: 100 * time.Millisecond, PausedRetention: 3 * time.Second, Logger: logger})
	defer e.destroy()
	ctx := context.Background()
	old, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	running, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// runc cannot checkpoint here: a pause keeps the files.
	if _, err := e.mgr.Pause(ctx, team.MustParse("t1"), old.ID, false); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	if !poll.Within(20*time.Second, 50*time.Millisecond, func() bool {
		_, err := st.GetSandbox(ctx, old.ID)
		return errors.Is(err, store.ErrNotFound)
	}) {
		t.Fatal("the sandbox paused past the retention was not removed within 20 s")
	}
	if waited := time.Since(pausedAt); waited < 3*time.Second {
		t.Errorf("removed after %v, before the retention of 3 s", waited)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", old.ID)); !os.IsNotExist(err) {
		t.Errorf("its kept root filesystem is left: %v", err)
	}
	if _, err := e.mgr.cfg.Node.Runtime().State(ctx, old.ID); err == nil {
		t.Error("its container is left")
	}
	if got, err := e.mgr.Get(ctx, team.MustParse("t1"), running.ID); err != nil || got.State != store.StateRunning {
		t.Errorf("the running sandbox: %+v %v", got, err)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "paused longer than the retention") || !strings.Contains(logs.String(), old.ID) {
		t.Errorf("no log line for the removal:\n%s", logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
