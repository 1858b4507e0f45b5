package store

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

const nodeColumns = "name, address, runtime, cpus, memory_mb, max_sandboxes, state, registered_at, heartbeat_at, sandboxes, used_cpus, used_memory_mb, warm, " +
	"disk_mb, labels, free_disk_mb, identity_key"

func scanNode(row interface{ Scan(...any) error }) (Node, error) {
	var n Node
	var registered, heartbeat int64
	var state, warm, labels string
	err := row.Scan(&n.Name, &n.Address, &n.Runtime, &n.CPUs, &n.MemoryMB, &n.MaxSandboxes, &state,
		&registered, &heartbeat, &n.Sandboxes, &n.UsedCPUs, &n.UsedMemoryMB, &warm, &n.DiskMB, &labels, &n.FreeDiskMB, &n.IdentityKey)
	n.State, n.RegisteredAt, n.HeartbeatAt = NodeState(state), fromMS(registered), fromMS(heartbeat)
	n.Warm = parseWarm(warm)
	n.Labels = parsePairs(labels)
	return n, err
}

// formatWarm is NodeUsage.Warm as the warm column keeps it:
// "ID=COUNT,..." (formatPairs).
func formatWarm(w map[string]int) string {
	m := make(map[string]string, len(w))
	for id, n := range w {
		if n > 0 {
			m[id] = strconv.Itoa(n)
		}
	}
	return formatPairs(m)
}

// parseWarm reads the warm column; what does not parse is left out.
func parseWarm(s string) map[string]int {
	var w map[string]int
	for id, v := range parsePairs(s) {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			if w == nil {
				w = map[string]int{}
			}
			w[id] = n
		}
	}
	return w
}

// formatPairs is labels as the labels column keeps them: "KEY=VALUE,..."
// in key order (keys and values hold neither ',' nor '=': ValidLabel).
func formatPairs(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, ",")
}

func parsePairs(s string) map[string]string {
	if s == "" {
		return nil
	}
	m := map[string]string{}
	for _, e := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(e, "="); ok && k != "" {
			m[k] = v
		}
	}
	return m
}

func (s *SQL) RegisterNode(ctx context.Context, n Node) error {
	if n.Name == "" {
		return fmt.Errorf("store: a node without a name")
	}
	_, err := s.db.ExecContext(ctx, s.q("INSERT INTO nodes ("+nodeColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "+
		"ON CONFLICT (name) DO UPDATE SET address = excluded.address, runtime = excluded.runtime, cpus = excluded.cpus, "+
		"memory_mb = excluded.memory_mb, max_sandboxes = excluded.max_sandboxes, heartbeat_at = excluded.heartbeat_at, "+
		"sandboxes = excluded.sandboxes, used_cpus = excluded.used_cpus, used_memory_mb = excluded.used_memory_mb, warm = excluded.warm, "+
		"disk_mb = excluded.disk_mb, labels = excluded.labels, free_disk_mb = excluded.free_disk_mb, identity_key = excluded.identity_key"),
		n.Name, n.Address, n.Runtime, n.CPUs, n.MemoryMB, n.MaxSandboxes, string(NodeReady),
		ms(n.RegisteredAt), ms(n.HeartbeatAt), n.Sandboxes, n.UsedCPUs, n.UsedMemoryMB, formatWarm(n.Warm),
		n.DiskMB, formatPairs(n.Labels), n.FreeDiskMB, n.IdentityKey)
	return err
}

// HeartbeatNode is one statement, which answers the node's state too:
// 100 nodes heartbeat 50 times a second, and each round trip is a share of
// PostgreSQL's time (test/scale).
func (s *SQL) HeartbeatNode(ctx context.Context, name string, at time.Time, u NodeUsage) (NodeState, error) {
	var state string
	err := s.db.QueryRowContext(ctx, s.q("UPDATE nodes SET heartbeat_at = ?, sandboxes = ?, used_cpus = ?, used_memory_mb = ?, warm = ?, free_disk_mb = ? WHERE name = ? RETURNING state"),
		ms(at), u.Sandboxes, u.UsedCPUs, u.UsedMemoryMB, formatWarm(u.Warm), u.FreeDiskMB, name).Scan(&state)
	return NodeState(state), notFound("node", name, err)
}

func (s *SQL) GetNode(ctx context.Context, name string) (Node, error) {
	n, err := scanNode(s.db.QueryRowContext(ctx, s.q("SELECT "+nodeColumns+" FROM nodes WHERE name = ?"), name))
	return n, notFound("node", name, err)
}

func (s *SQL) ListNodes(ctx context.Context) ([]Node, error) {
	return queryAll(ctx, s.db, s.q("SELECT "+nodeColumns+" FROM nodes ORDER BY name"), scanNode)
}

func (s *SQL) SetNodeState(ctx context.Context, name string, state NodeState) error {
	if !ValidNodeState(state) {
		return fmt.Errorf("store: %q is not a node state", state)
	}
	res, err := s.db.ExecContext(ctx, s.q("UPDATE nodes SET state = ? WHERE name = ?"), string(state), name)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("store: node %s: %w", name, ErrNotFound)
	}
	return nil
}
