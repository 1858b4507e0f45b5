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
	var targets []string
	m.mu.Lock()
	for _, l := range m.live {
		if !l.paused {
			targets = append(targets, l.id)
		}
	}
	m.mu.Unlock()
	var errs []error
	// The node's own work, on every team's sandboxes: all teams' scope.
	for _, id := range targets {
		if ctx.Err() != nil {
			break
		}
		if _, perr := m.pauseIn(ctx, store.AllTeams(), id, m.canCheckpoint()); perr != nil && !errors.Is(perr, ErrNotFound) {
			if ctx.Err() != nil {
				break // the server is stopping: a pause cut short is no reason to kill
			}
			m.log.WarnContext(ctx, "draining: a pause failed; killing the sandbox", "sandbox", id, "err", perr)
			if kerr := m.killIn(ctx, store.AllTeams(), id); kerr != nil && !errors.Is(kerr, ErrNotFound) {
				errs = append(errs, fmt.Errorf("sandbox %s: %w", id, kerr))
			}
		}
	}
	return m.Usage().Sandboxes, errors.Join(errs...)
}
