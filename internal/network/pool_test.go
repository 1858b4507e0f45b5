package network

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/warren-sandbox/warren/internal/poll"
)

// waitPool waits, for at most 5 s, until the pool holds n ready slots.
func waitPool(tb testing.TB, m *Manager, n int) {
	tb.Helper()
	if !poll.Within(5*time.Second, 2*time.Millisecond, func() bool { return len(m.pool) >= n }) {
		tb.Fatalf("pool has %d ready slots after 5 s, want %d", len(m.pool), n)
	}
}

func TestPool(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: 2})
	waitPool(t, m, 2)
	pooled := map[string]bool{}
	for id := range m.cfg.slotCount() {
		if name := m.cfg.nsName(id); m.IsPooled(name) {
			pooled[name] = true
		}
		if len(pooled) == 2 {
			break
		}
	}
	start := time.Now()
	s, err := m.Acquire(context.Background())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(s)
	t.Logf("Acquire from a warm pool took %v", took)
	// Proof that it came from the pool, whatever the timing: it was built
	// before Acquire was called.
	if !pooled[s.Name] {
		t.Errorf("Acquire returned %s, not one of the pooled %v", s.Name, pooled)
	}
	if m.IsPooled(s.Name) {
		t.Errorf("%s still reported pooled after Acquire", s.Name)
	}
	if took > 50*time.Millisecond {
		t.Errorf("Acquire from a warm pool took %v", took)
	}
	waitPool(t, m, 2) // refilled in the background
	// Close (in the test cleanup) removes the pooled slots and the tables.
}

// A run that crashed left slots (one still used by a live sandbox) and
// half-made ones; the next run steps over them, then cleans up.
func TestCleanupOfLeftovers(t *testing.T) {
	needRoot(t)
	crashed, err := New(Config{Prefix: testPrefix, CIDR: netip.MustParsePrefix(testCIDR), PoolSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	live, dead := acquire(t, crashed), acquire(t, crashed) // ids 0, 1
	crashed.nl.Close()                                     // the process dies without cleaning up
	// Half-made leftovers: a namespace file that was never pinned (id 5)
	// and a veth whose namespace is gone (id 6).
	c := crashed.cfg
	if err := os.WriteFile(c.slot(5).NetNSPath, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	lone := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: c.vethName(6)}, PeerName: testPrefix + "x6"}
	if err := netlink.LinkAdd(lone); err != nil {
		t.Fatal(err)
	}

	m := newTestManager(t, Config{PoolSize: -1})
	var mine []*Slot
	for range 6 {
		s := acquire(t, m)
		mine = append(mine, s)
		if s.ID == live.ID || s.ID == dead.ID || s.ID == 5 || s.ID == 6 {
			t.Errorf("handed out %s, whose names a leftover holds", s.Name)
		}
	}
	claimed := map[string]bool{live.Name: true}
	for _, s := range mine {
		claimed[s.Name] = true
	}
	if err := m.Cleanup(func(name string) bool { return claimed[name] }); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []*Slot{dead, c.slot(5), c.slot(6)} {
		if _, err := os.Lstat(gone.NetNSPath); !os.IsNotExist(err) {
			t.Errorf("leftover netns %s survived Cleanup", gone.Name)
		}
		if _, err := netlink.LinkByName(gone.HostVeth); err == nil {
			t.Errorf("leftover veth %s survived Cleanup", gone.HostVeth)
		}
	}
	for _, kept := range append([]*Slot{live}, mine...) {
		if _, err := os.Stat(kept.NetNSPath); err != nil {
			t.Errorf("Cleanup removed claimed slot %s: %v", kept.Name, err)
		}
	}
	// The live one's /30 stays reserved until it is adopted and released.
	for _, s := range mine {
		m.Release(s)
	}
	more := acquire(t, m)
	if more.ID == live.ID {
		t.Errorf("handed out %s, which a live sandbox of the previous run uses", more.Name)
	}
	m.Release(more)
	adopted, ok := m.Adopt(live.Name)
	if !ok {
		t.Fatalf("Adopt(%s) failed", live.Name)
	}
	if *adopted != *live {
		t.Errorf("adopted %+v, want %+v", adopted, live)
	}
	if _, ok := m.Adopt(live.Name); ok {
		t.Error("adopted the same slot twice")
	}
	if err := m.Release(adopted); err != nil {
		t.Fatal(err)
	}
	// Cleanup with nothing claimed removes slots this run handed out too.
	s := acquire(t, m)
	if err := m.Cleanup(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.NetNSPath); !os.IsNotExist(err) {
		t.Errorf("unclaimed slot %s survived Cleanup", s.Name)
	}
	if err := m.Release(s); err != nil { // already gone: nothing to do
		t.Error(err)
	}
}
