package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestNodes(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		a := Node{Name: "a", Address: "10.0.0.1:3010", Runtime: "runsc", CPUs: 2, MemoryMB: 4096, MaxSandboxes: 100,
			DiskMB: 102400, Labels: map[string]string{"zone": "a", "warren.dev/disk": "ssd"}, IdentityKey: `{"kty":"EC"}`, RegisteredAt: t0, HeartbeatAt: t0}
		if err := s.RegisterNode(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := s.RegisterNode(ctx, Node{Name: "b", Runtime: "runc", RegisteredAt: t0, HeartbeatAt: t0}); err != nil {
			t.Fatal(err)
		}
		if err := s.RegisterNode(ctx, Node{}); err == nil {
			t.Error("a node without a name was registered")
		}
		got, err := s.GetNode(ctx, "a")
		a.State = NodeReady
		if err != nil || !reflect.DeepEqual(got, a) {
			t.Errorf("GetNode = %+v %v, want %+v", got, err, a)
		}
		// A heartbeat records the use and answers the state.
		at := t0.Add(2 * time.Second)
		state, err := s.HeartbeatNode(ctx, "a", at, NodeUsage{Sandboxes: 3, UsedCPUs: 6, UsedMemoryMB: 1536, FreeDiskMB: 900, Warm: map[string]int{"base": 2, "t1": 1, "none": 0}})
		if err != nil || state != NodeReady {
			t.Errorf("heartbeat: %s %v", state, err)
		}
		if got, _ := s.GetNode(ctx, "a"); got.UsedMemoryMB != 1536 || got.FreeDiskMB != 900 || !reflect.DeepEqual(got.Warm, map[string]int{"base": 2, "t1": 1}) {
			t.Errorf("after a heartbeat: %+v", got)
		}
		if _, err := s.HeartbeatNode(ctx, "nobody", at, NodeUsage{}); !errors.Is(err, ErrNotFound) {
			t.Errorf("the heartbeat of an unregistered node: %v", err)
		}
		// The operator's state survives heartbeats and a re-registration.
		if err := s.SetNodeState(ctx, "a", NodeCordoned); err != nil {
			t.Fatal(err)
		}
		if state, err := s.HeartbeatNode(ctx, "a", at.Add(time.Second), NodeUsage{Sandboxes: 3}); err != nil || state != NodeCordoned {
			t.Errorf("heartbeat after cordon: %s %v", state, err)
		}
		a.Address, a.CPUs, a.HeartbeatAt = "10.0.0.9:3010", 4, at.Add(5*time.Second)
		if err := s.RegisterNode(ctx, a); err != nil {
			t.Fatal(err)
		}
		got, _ = s.GetNode(ctx, "a")
		if got.State != NodeCordoned || got.Address != "10.0.0.9:3010" || got.CPUs != 4 || !got.HeartbeatAt.Equal(a.HeartbeatAt) || !got.RegisteredAt.Equal(t0) {
			t.Errorf("after a re-registration: %+v", got)
		}
		for _, bad := range []NodeState{"", "lost", "READY"} {
			if err := s.SetNodeState(ctx, "a", bad); err == nil {
				t.Errorf("state %q was set", bad)
			}
		}
		if err := s.SetNodeState(ctx, "nobody", NodeDraining); !errors.Is(err, ErrNotFound) {
			t.Errorf("the state of an unknown node: %v", err)
		}
		nodes, err := s.ListNodes(ctx)
		if err != nil || len(nodes) != 2 || nodes[0].Name != "a" || nodes[1].Name != "b" {
			t.Errorf("ListNodes = %+v %v", nodes, err)
		}
		if !nodes[1].Lost(t0.Add(11*time.Second), 10*time.Second) || nodes[0].Lost(a.HeartbeatAt.Add(9*time.Second), 10*time.Second) {
			t.Error("Lost does not compare the heartbeat with the timeout")
		}

		// A node whose clock runs ahead past the cluster's skew window is
		// not believed: dead, it would count as alive that much longer.
		now := time.Now()
		if !(Node{HeartbeatAt: now.Add(90 * time.Second)}).Lost(now, 10*time.Second) {
			t.Error("a heartbeat dated 90 s ahead counts")
		}
		if (Node{HeartbeatAt: now.Add(30 * time.Second)}).Lost(now, 10*time.Second) {
			t.Error("a heartbeat dated 30 s ahead, within the skew window, does not count")
		}
	})
}

func TestValidLabel(t *testing.T) {
	for _, kv := range [][2]string{{"zone", "a"}, {"warren.dev/disk", "ssd"}, {"k_1", "v-2.0"}} {
		if !ValidLabel(kv[0], kv[1]) {
			t.Errorf("%v refused", kv)
		}
	}
	for _, kv := range [][2]string{{"", "a"}, {"k", ""}, {"a,b", "c"}, {"a", "b=c"}, {"sp ace", "x"}, {"k", "\n"}} {
		if ValidLabel(kv[0], kv[1]) {
			t.Errorf("%q taken", kv)
		}
	}
}
