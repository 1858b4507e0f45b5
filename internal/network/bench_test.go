package network

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
)

// Benchmarks use a prefix and range of their own.
func newBenchManager(b *testing.B, pool int) *Manager {
	b.Helper()
	needRoot(b)
	m, err := New(Config{Prefix: "wbch", CIDR: netip.MustParsePrefix("10.123.0.0/16"), PoolSize: pool})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := m.Destroy(); err != nil {
			b.Error(err)
		}
		if left := leftovers(b, "wbch"); len(left) > 0 {
			b.Errorf("left behind: %v", left)
		}
	})
	return m
}

// BenchmarkSlotSetup times building a slot from nothing (no pool):
// namespace, veth pair, addresses, routes. Teardown is not counted.
func BenchmarkSlotSetup(b *testing.B) {
	m := newBenchManager(b, -1)
	for b.Loop() {
		s, err := m.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := m.Release(s); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkSlotTeardown times Release: veth, namespace, conntrack entries.
func BenchmarkSlotTeardown(b *testing.B) {
	m := newBenchManager(b, -1)
	for b.Loop() {
		b.StopTimer()
		s, err := m.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := m.Release(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireFromPool times Acquire with a warm pool. Waiting for the
// refill and releasing are not counted.
func BenchmarkAcquireFromPool(b *testing.B) {
	m := newBenchManager(b, 4)
	for b.Loop() {
		b.StopTimer()
		if !poll.Within(5*time.Second, 100*time.Microsecond, func() bool { return len(m.pool) > 0 }) {
			b.Fatal("pool did not refill within 5 s")
		}
		b.StartTimer()
		s, err := m.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := m.Release(s); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
