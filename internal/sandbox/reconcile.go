package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/warren-sandbox/warren/internal/runtime"
)

// The reconciler. A running sandbox's container can end without the
// manager asking: its runsc sandbox process OOM-killed or killed from the
// host, envd gone. Nothing else would notice (the reaper only looks at
// end times), and the store would call it running until it timed out.
// Every ReconcileInterval the runtime's containers (one List, one
// process) are compared with the sandboxes the manager runs; one whose
// container is stopped or gone is asked again under its lock (a pause,
// resume or snapshot in progress holds that lock and is left alone), and
// if it is still dead it is removed as a kill removes it: its record goes
// (a GET answers 404, which E2B's SDKs read as a sandbox that ended), and
// its container, cgroups, root filesystem, loop device and network slot
// are released. A ready warm sandbox whose container died is discarded
// and its pool starts another: a create would otherwise claim it.

// DefaultReconcileInterval is Config.ReconcileInterval's default.
const DefaultReconcileInterval = 5 * time.Second

// reconcile removes the running sandboxes whose container died.
func (m *Manager) reconcile() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The candidates are taken before the list: a sandbox that becomes
	// live after it is not judged by a list older than its container.
	m.mu.Lock()
	var running []*live
	for _, l := range m.live {
		if l.inst != nil && !l.paused {
			running = append(running, l)
		}
	}
	pools := len(m.pools)
	m.mu.Unlock()
	if len(running) == 0 && pools == 0 {
		return
	}
	listed := time.Now()
	cs, err := m.cfg.Node.Runtime().List(ctx)
	if err != nil {
		m.log.Warn("reconciler: listing the runtime's containers", "err", err)
		return
	}
	alive := make(map[string]bool, len(cs))
	for _, c := range cs {
		alive[c.ID] = c.State != runtime.StateStopped
	}
	for _, l := range running {
		if alive[l.id] {
			continue
		}
		m.reconcileOne(ctx, l)
	}
	m.reconcileWarm(listed, alive)
}

// reconcileWarm discards the ready warm sandboxes whose container is not
// alive in a list taken at listed (those started since are left to the
// next pass) and has their pools start others. Each pool's channel is
// turned once round, its order kept; a claim meanwhile takes one as
// usual, or finds none and starts cold.
func (m *Manager) reconcileWarm(listed time.Time, alive map[string]bool) {
	var dead []*warm
	var refill []*pool
	m.mu.Lock()
	for _, p := range m.pools {
		found := false
		for range len(p.ready) {
			var w *warm
			select {
			case w = <-p.ready:
			default:
			}
			if w == nil {
				break
			}
			if w.readyAt.Before(listed) && !alive[w.inst.ID] {
				dead, found = append(dead, w), true
				continue
			}
			select {
			case p.ready <- w:
			default: // cannot happen: ready and building never exceed the capacity
				dead = append(dead, w)
			}
		}
		if found {
			refill = append(refill, p)
		}
	}
	m.mu.Unlock()
	for _, w := range dead {
		m.log.Warn("a warm sandbox's runtime died before any create claimed it; discarding it", "sandbox", w.inst.ID)
		m.discard(w.inst)
	}
	for _, p := range refill {
		p.refill()
	}
}

// reconcileOne removes l if its container is dead, asked again with its
// lock held. A lifecycle operation under way holds the lock: l is left to
// the next pass.
func (m *Manager) reconcileOne(ctx context.Context, l *live) {
	if !l.mu.TryLock() {
		return
	}
	defer l.mu.Unlock()
	m.mu.Lock()
	current := m.live[l.id] == l && l.inst != nil && !l.paused
	m.mu.Unlock()
	if !current {
		return
	}
	st, err := m.cfg.Node.State(ctx, l.id)
	switch {
	case errors.Is(err, runtime.ErrNotFound), err == nil && st == runtime.StateStopped:
	case err != nil:
		m.log.Warn("reconciler: asking a sandbox's state", "sandbox", l.id, "err", err)
		return
	default:
		return // alive after all
	}
	m.log.Warn("a running sandbox's runtime died under it (its process was killed or ran out of memory); removing it",
		"sandbox", l.id, "team", l.teamID, "runtime_state", string(st))
	if err := m.killLocked(ctx, l); err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Warn("reconciler: removing a sandbox whose runtime died", "sandbox", l.id, "err", err)
	}
}
