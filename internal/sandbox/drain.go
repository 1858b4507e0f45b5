package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/warren-sandbox/warren/internal/store"
)

// What the node's cluster membership (internal/cluster) asks of the
// manager: what the node uses, for its heartbeats, and pausing everything
// when an operator drains the node. Config.Admit is how the membership
// refuses new sandboxes on a cordoned or draining node.

// Usage is what this node holds now: its running sandboxes (paused and
// warm ones are not counted), the nominal CPUs and memory of all it runs,
// warm and starting sandboxes included (what admission counts), and its
// warm sandboxes by template.
func (m *Manager) Usage() store.NodeUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.usedLocked()
	running := 0
	for _, l := range m.live {
		if !l.paused {
			running++
		}
	}
	warm := map[string]int{}
	for id, p := range m.pools {
		if n := len(p.ready); n > 0 {
			warm[id] = n
		}
	}
	return store.NodeUsage{Sandboxes: running, UsedCPUs: u.cpus, UsedMemoryMB: u.memoryMB, Warm: warm}
}

// Drain pauses every running sandbox of the node, with its memory where
// the runtime can checkpoint (else its files only), and kills one whose
// pause fails: a drained node runs nothing. It returns how many still run
// (created meanwhile, or whose kill failed too).
func (m *Manager) Drain(ctx context.Context) (running int, err error) {
	type target struct{ teamID, id string }
	var targets []target
	m.mu.Lock()
	for _, l := range m.live {
		if !l.paused {
			targets = append(targets, target{l.teamID, l.id})
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, t := range targets {
		if ctx.Err() != nil {
			break
		}
		if _, perr := m.Pause(ctx, t.teamID, t.id, m.canCheckpoint()); perr != nil && !errors.Is(perr, ErrNotFound) {
			if ctx.Err() != nil {
				break // the server is stopping: a pause cut short is no reason to kill
			}
			m.log.WarnContext(ctx, "draining: a pause failed; killing the sandbox", "sandbox", t.id, "err", perr)
			if kerr := m.Kill(ctx, t.teamID, t.id); kerr != nil && !errors.Is(kerr, ErrNotFound) {
				errs = append(errs, fmt.Errorf("sandbox %s: %w", t.id, kerr))
			}
		}
	}
	return m.Usage().Sandboxes, errors.Join(errs...)
}
