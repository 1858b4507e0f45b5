package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/store"
)

// Observer is told how the manager's operations ended, for metrics
// (internal/metrics.Metrics is one). It is called on the operation's
// goroutine once it returns, so it must be quick.
type Observer interface {
	// Observe reports that operation (an Op* constant) took d and
	// ended with outcome (a metrics.Outcome* constant).
	Observe(operation string, d time.Duration, outcome string)
}

// The operations reported to the Observer. A new lifecycle operation
// (a checkpoint, a fork) gets its own constant and one deferred observe
// call at its start.
const (
	OpCreate = "create"
	OpPause  = "pause"
	OpResume = "resume"
)

// observe reports operation, started at start, with the error *err it
// returns: call it deferred, first thing, with the named error result.
func (m *Manager) observe(operation string, start time.Time, err *error) {
	if m.cfg.Observer != nil {
		m.cfg.Observer.Observe(operation, time.Since(start), Outcome(*err))
	}
}

// Outcome names how an operation that returned err ended, in the bounded
// vocabulary of the metrics' outcome label.
func Outcome(err error) string {
	switch {
	case err == nil:
		return metrics.OutcomeOK
	case errors.Is(err, ErrInvalid):
		return metrics.OutcomeInvalid
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrTemplateNotFound), errors.Is(err, store.ErrNotFound):
		return metrics.OutcomeNotFound
	case errors.Is(err, ErrNoCapacity):
		return metrics.OutcomeNoCapacity
	case errors.Is(err, ErrTeamLimit):
		return metrics.OutcomeTeamLimit
	case errors.Is(err, ErrConflict):
		return metrics.OutcomeConflict
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return metrics.OutcomeCanceled
	default:
		return metrics.OutcomeError
	}
}

// NodeStats is what the node holds now: its sandboxes by state, its warm
// pools, its capacity and what sandboxes hold of it. Metrics read it at
// each scrape (metrics.NodeSource).
func (m *Manager) NodeStats() metrics.NodeStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := metrics.NodeStats{
		Node: m.cfg.NodeName, Runtime: m.cfg.Node.Runtime().Name(),
		Starting: m.starting.sandboxes, Warm: map[string]int{}, WarmTarget: map[string]int{},
		HostCPUs: m.cfg.NodeCPUs, HostMemoryBytes: int64(m.cfg.NodeMemoryMB) << 20,
		CapacityCPUs:        float64(m.cfg.NodeCPUs) * m.cfg.CPUOvercommit,
		CapacityMemoryBytes: int64(float64(m.cfg.NodeMemoryMB)*m.cfg.MemoryOvercommit) << 20,
		CapacitySandboxes:   m.cfg.MaxSandboxes,
	}
	for _, l := range m.live {
		if l.paused {
			s.Paused++
		} else {
			s.Running++
		}
	}
	for id, p := range m.pools {
		// Labels are bounded: the pools of templates a team made on
		// demand are summed.
		if p.floor == 0 {
			id = "other"
		}
		s.Warm[id] += len(p.ready)
		s.WarmTarget[id] += p.target
	}
	u := m.usedLocked()
	s.UsedCPUs, s.UsedMemoryBytes, s.UsedSandboxes = u.cpus, int64(u.memoryMB)<<20, u.sandboxes
	return s
}
