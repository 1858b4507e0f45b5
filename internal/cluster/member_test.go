package cluster

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/store"
)

func TestMemberFollowsTheOperatorsState(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var running, drains atomic.Int64
	running.Store(3)
	cfg := Config{
		Store: st,
		Node:  store.Node{Name: "n1", Address: "127.0.0.1:3010", Runtime: "runsc", CPUs: 2, MemoryMB: 4096, MaxSandboxes: 100},
		Usage: func() store.NodeUsage {
			return store.NodeUsage{Sandboxes: int(running.Load()), UsedCPUs: 2, UsedMemoryMB: 512}
		},
		Drain:     func(context.Context) (int, error) { drains.Add(1); running.Store(0); return 0, nil },
		Heartbeat: 20 * time.Millisecond,
	}
	m, err := Join(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := st.GetNode(ctx, "n1")
	if err != nil || n.State != store.NodeReady || n.CPUs != 2 || n.Sandboxes != 3 || n.Address != "127.0.0.1:3010" {
		t.Fatalf("registered %+v %v", n, err)
	}
	if err := m.Admit(ctx); err != nil {
		t.Errorf("a ready node refused: %v", err)
	}
	stateIs := func(want store.NodeState) bool {
		return poll.Within(5*time.Second, 10*time.Millisecond, func() bool { return m.State() == want })
	}

	if err := st.SetNodeState(ctx, "n1", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	if !stateIs(store.NodeCordoned) {
		t.Fatal("the cordon did not reach the node within 5 s")
	}
	if err := m.Admit(ctx); err == nil || !strings.Contains(err.Error(), "cordoned") {
		t.Errorf("a cordoned node admitted: %v", err)
	}
	if drains.Load() != 0 {
		t.Error("a cordoned node drained")
	}

	if err := st.SetNodeState(ctx, "n1", store.NodeDraining); err != nil {
		t.Fatal(err)
	}
	if !poll.Within(5*time.Second, 10*time.Millisecond, func() bool {
		n, _ := st.GetNode(ctx, "n1")
		return drains.Load() > 0 && n.Sandboxes == 0
	}) {
		t.Fatalf("the draining node did not drain within 5 s (%d drains)", drains.Load())
	}
	if err := m.Admit(ctx); err == nil {
		t.Error("a draining node admitted")
	}

	if err := st.SetNodeState(ctx, "n1", store.NodeReady); err != nil {
		t.Fatal(err)
	}
	if !stateIs(store.NodeReady) || m.Admit(ctx) != nil {
		t.Error("uncordoned, the node still refuses")
	}

	m.Close()
	last, _ := st.GetNode(ctx, "n1")
	time.Sleep(100 * time.Millisecond)
	if n, _ := st.GetNode(ctx, "n1"); !n.HeartbeatAt.Equal(last.HeartbeatAt) {
		t.Error("heartbeats went on after Close")
	}
	if !last.Lost(time.Now().Add(DefaultLostAfter+time.Second), DefaultLostAfter) {
		t.Error("a node not heard from for longer than the timeout is not lost")
	}

	// A restarted node keeps the state the operator set.
	if err := st.SetNodeState(ctx, "n1", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	again, err := Join(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.Admit(ctx) == nil {
		t.Error("a cordoned node restarted ready")
	}
}

// An uncordon takes effect at the node's next create, not at its next
// heartbeat: the api places by the store's state at once, and a node that
// still refused would send the create elsewhere.
func TestUncordonAdmitsBeforeTheNextHeartbeat(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	node := store.Node{Name: "n1", Address: "127.0.0.1:3010", Runtime: "runsc", CPUs: 2, MemoryMB: 4096}
	if err := st.RegisterNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	if err := st.SetNodeState(ctx, "n1", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	m, err := Join(ctx, Config{Store: st, Node: node, Usage: func() store.NodeUsage { return store.NodeUsage{} }, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Admit(ctx); err == nil || !strings.Contains(err.Error(), "cordoned") {
		t.Fatalf("a cordoned node admitted: %v", err)
	}
	if err := st.SetNodeState(ctx, "n1", store.NodeReady); err != nil {
		t.Fatal(err)
	}
	if err := m.Admit(ctx); err != nil {
		t.Fatalf("uncordoned in the store, the node still refuses until its heartbeat: %v", err)
	}
	if m.State() != store.NodeReady {
		t.Errorf("the node's state is %s after it admitted", m.State())
	}
}
