// Package cluster is this node's membership in the cluster kept in the
// store: it registers the node (name, address, runtime, capacity) when
// `warren serve` starts, heartbeats what the node uses every few seconds,
// and follows the state an operator sets with `warren nodes`: a cordoned
// node takes no new sandboxes, a draining one also pauses its running
// sandboxes. Readers tell a lost node by its old heartbeat
// (store.Node.Lost). A single `warren serve` is a cluster of one node.
// Auth (auth.go) is how the processes of a cluster prove to each other
// that they hold the cluster secret.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// DefaultHeartbeat is how often a node heartbeats; DefaultLostAfter how
// long readers wait for one before they call the node lost.
const (
	DefaultHeartbeat = 2 * time.Second
	DefaultLostAfter = 10 * time.Second
)

// Config wires a Member.
type Config struct {
	Store store.NodeStore
	// Node is what the node registers: its name, address, runtime and
	// capacity (its state and times are the store's).
	Node store.Node
	// Usage reports what the node holds, for each heartbeat.
	Usage func() store.NodeUsage
	// Drain pauses the node's running sandboxes while it is draining and
	// says how many still run.
	Drain func(ctx context.Context) (running int, err error)
	// Heartbeat is the interval; default DefaultHeartbeat.
	Heartbeat time.Duration
	Logger    *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Member is a registered node that heartbeats until Close.
type Member struct {
	cfg    Config
	log    *slog.Logger
	mu     sync.Mutex
	state  store.NodeState
	stop   chan struct{}
	done   chan struct{}
	cancel context.CancelFunc
	// draining is set while a Drain runs; wg waits for it on Close.
	draining atomic.Bool
	wg       sync.WaitGroup
}

// Join registers the node and starts its heartbeats.
func Join(ctx context.Context, cfg Config) (*Member, error) {
	if cfg.Store == nil || cfg.Usage == nil || cfg.Node.Name == "" {
		return nil, errors.New("cluster: Store, Usage and Node.Name are required")
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	n := cfg.Node
	n.RegisteredAt, n.HeartbeatAt, n.NodeUsage = cfg.Now(), cfg.Now(), cfg.Usage()
	if err := cfg.Store.RegisterNode(ctx, n); err != nil {
		return nil, fmt.Errorf("cluster: registering node %s: %w", n.Name, err)
	}
	got, err := cfg.Store.GetNode(ctx, n.Name)
	if err != nil {
		return nil, fmt.Errorf("cluster: reading node %s: %w", n.Name, err)
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	m := &Member{cfg: cfg, log: cfg.Logger, state: got.State, stop: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	if got.State != store.NodeReady {
		m.log.Warn("this node is not ready: it takes no new sandboxes until `warren nodes uncordon`", "node", n.Name, "state", got.State)
	}
	go m.run(loopCtx)
	return m, nil
}

// Admit refuses new sandboxes unless the node is ready. A node that
// believes itself cordoned or draining asks the store again before it
// refuses: an uncordon takes effect at once, not at the next heartbeat
// (the api already places by the store's state). If the store cannot
// be read, the last state known stands.
func (m *Member) Admit(ctx context.Context) error {
	state := m.State()
	if state != store.NodeReady {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		n, err := m.cfg.Store.GetNode(rctx, m.cfg.Node.Name)
		cancel()
		if err == nil {
			state = n.State
			m.mu.Lock()
			m.state = state
			m.mu.Unlock()
		}
	}
	if state != store.NodeReady {
		return fmt.Errorf("node %s is %s by an operator and takes no new sandboxes", m.cfg.Node.Name, state)
	}
	return nil
}

// State is the node's state as of its last heartbeat.
func (m *Member) State() store.NodeState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

// Close stops the heartbeats (the record stays: the node is lost after
// the timeout unless it comes back).
func (m *Member) Close() {
	m.cancel()
	close(m.stop)
	<-m.done
	m.wg.Wait()
}

func (m *Member) run(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.beat(ctx)
	}
}

// beat records one heartbeat, takes the state the store holds, and
// drains the node while it is draining.
func (m *Member) beat(ctx context.Context) {
	hb, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
	defer cancel()
	state, err := m.cfg.Store.HeartbeatNode(hb, m.cfg.Node.Name, m.cfg.Now(), m.cfg.Usage())
	if errors.Is(err, store.ErrNotFound) {
		// Removed from the store while running: register again.
		n := m.cfg.Node
		n.RegisteredAt, n.HeartbeatAt, n.NodeUsage = m.cfg.Now(), m.cfg.Now(), m.cfg.Usage()
		err = m.cfg.Store.RegisterNode(hb, n)
		state = store.NodeReady
	}
	if err != nil {
		m.log.Warn("cluster: heartbeat failed", "node", m.cfg.Node.Name, "err", err)
		return
	}
	m.mu.Lock()
	was := m.state
	m.state = state
	m.mu.Unlock()
	if state != was {
		m.log.Info("cluster: node state changed", "node", m.cfg.Node.Name, "state", state, "was", was)
	}
	if state == store.NodeDraining && m.cfg.Drain != nil && m.draining.CompareAndSwap(false, true) {
		// Pausing many sandboxes takes a while: the heartbeats go on
		// meanwhile, or the node would look lost.
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			defer m.draining.Store(false)
			if running, err := m.cfg.Drain(ctx); err != nil {
				m.log.Warn("cluster: draining", "node", m.cfg.Node.Name, "running", running, "err", err)
			}
		}()
	}
}

// StateOf is a node's state as readers show it: lost when its heartbeat is
// older than lostAfter, else the state its operator set.
func StateOf(n store.Node, now time.Time, lostAfter time.Duration) string {
	if n.Lost(now, lostAfter) {
		return "lost"
	}
	return string(n.State)
}

// WaitDrained waits until a draining node runs no sandbox, calling
// progress with its record after each of its heartbeats. A node that is
// lost meanwhile, or no longer draining, is an error.
func WaitDrained(ctx context.Context, st store.NodeStore, name string, lostAfter time.Duration, progress func(store.Node)) error {
	since := time.Now()
	var seen time.Time
	for {
		n, err := st.GetNode(ctx, name)
		if err != nil {
			return err
		}
		if !n.HeartbeatAt.Equal(seen) {
			seen = n.HeartbeatAt
			if progress != nil {
				progress(n)
			}
			// Only a heartbeat after the drain began speaks of it.
			if n.HeartbeatAt.After(since) && n.Sandboxes == 0 {
				return nil
			}
		}
		switch {
		case n.State != store.NodeDraining:
			return fmt.Errorf("node %s is %s now, no longer draining", name, n.State)
		case n.Lost(time.Now(), lostAfter):
			return fmt.Errorf("node %s is lost (no heartbeat since %s)", name, n.HeartbeatAt.Format(time.RFC3339))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
