package network

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/network/testhost"
)

// floodHost is the "internet" host the connection-bound tests flood: an
// address of 198.18.0.0/15 (benchmarking, RFC 2544) in a namespace of its
// own, so that no packet leaves the machine.
var floodHost = netip.MustParsePrefix("198.18.40.2/30")

// newFloodHost opens the flood target and checks that the host routes its
// address into the test namespace (testhost checks `ip route get` too).
func newFloodHost(tb testing.TB, name string) *testhost.Host {
	tb.Helper()
	needRoot(tb)
	h := testhost.New(tb, name, floodHost)
	if dev, err := testhost.RouteDev(h.Addr); err != nil || dev != h.Name {
		tb.Fatalf("%s is routed to %q (%v), not into the test namespace", h.Addr, dev, err)
	}
	return h
}

// floodUDP sends one datagram from the slot to each of n ports of dst (a
// new flow each, as a port scan or a UDP flood makes them) and returns how
// long sending took. It stops at the first send error.
func floodUDP(tb testing.TB, s *Slot, dst netip.Addr, n int) time.Duration {
	tb.Helper()
	var took time.Duration
	testhost.DoInNetNS(tb, s.NetNSPath, func() {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: s.SandboxIP.AsSlice()})
		if err != nil {
			tb.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		for i := range n {
			port := uint16(1 + i%65535)
			if _, err := c.WriteToUDPAddrPort([]byte("x"), netip.AddrPortFrom(dst, port)); err != nil {
				tb.Fatalf("datagram %d: %v", i, err)
			}
		}
		took = time.Since(start)
	})
	return took
}

// flowsFrom counts the conntrack entries the address opened.
func flowsFrom(tb testing.TB, ip netip.Addr) int {
	tb.Helper()
	flows, err := whole(func() ([]*netlink.ConntrackFlow, error) {
		return netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	})
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Forward.SrcIP.Equal(ip.AsSlice()) {
			n++
		}
	}
	return n
}

// forgetFlows deletes the slot's conntrack entries at the end of a test,
// so that a flood does not hold the host's table for the UDP timeout.
func forgetFlows(tb testing.TB, m *Manager, s *Slot) {
	tb.Cleanup(func() {
		if err := m.deleteFlows(flowsOf{s.SandboxIP: true}); err != nil {
			tb.Errorf("deleting the flood's conntrack entries: %v", err)
		}
	})
}

// A sandbox flooding UDP to many ports holds at most MaxConns conntrack
// entries, while another sandbox and the host itself keep connecting.
func TestConnLimitHoldsFlood(t *testing.T) {
	const maxConns, flood = 500, 3000
	h := newFloodHost(t, testPrefix+"f")
	port := h.ServeTCP(t, 0, "witness")
	target := netip.AddrPortFrom(h.Addr, uint16(port))
	m := newTestManager(t, Config{PoolSize: -1, MaxConns: maxConns, ConnRate: -1})
	flooder, witness := acquire(t, m), acquire(t, m)
	forgetFlows(t, m, flooder)

	floodUDP(t, flooder, h.Addr, flood)
	held := flowsFrom(t, flooder.SandboxIP)
	t.Logf("a flood of %d flows holds %d conntrack entries (bound %d)", flood, held, maxConns)
	if held > maxConns {
		t.Errorf("the flooding sandbox holds %d conntrack entries; want at most %d", held, maxConns)
	}
	if held < maxConns/2 {
		t.Errorf("the flooding sandbox holds only %d conntrack entries: the flood did not get through", held)
	}

	// The witness's new connections are its own: all of them get through
	// while the flooder is at its bound.
	testhost.DoInNetNS(t, witness.NetNSPath, func() {
		for i := range 20 {
			if saw, err := dialReachable(target.String(), netip.Addr{}); err != nil || saw != "witness" {
				t.Fatalf("witness connection %d: %q, %v", i, saw, err)
			}
		}
	})
	// So do the host's own.
	if saw, err := dialReachable(target.String(), netip.Addr{}); err != nil || saw != "witness" {
		t.Errorf("the host's connection: %q, %v", saw, err)
	}
	// And the flooder's TCP is refused at once (a reset), not left to
	// time out, while it is over its bound.
	testhost.DoInNetNS(t, flooder.NetNSPath, func() {
		if saw, err := dial(target.String(), netip.Addr{}); err == nil {
			t.Errorf("the flooder over its bound opened a connection (%q)", saw)
		}
	})
}

// A sandbox opening connections faster than ConnRate gets about the burst
// and the rate through, and the witness's connections all.
func TestConnRateHoldsFlood(t *testing.T) {
	const rate, flood = 100, 3000
	h := newFloodHost(t, testPrefix+"f")
	port := h.ServeTCP(t, 0, "witness")
	target := netip.AddrPortFrom(h.Addr, uint16(port))
	m := newTestManager(t, Config{PoolSize: -1, MaxConns: -1, ConnRate: rate})
	flooder, witness := acquire(t, m), acquire(t, m)
	forgetFlows(t, m, flooder)

	took := floodUDP(t, flooder, h.Addr, flood)
	held := flowsFrom(t, flooder.SandboxIP)
	// The burst (twice the rate), the rate over the time sending took,
	// and a second of slack for a slow machine.
	most := 2*rate + int(took.Seconds()*rate) + rate
	t.Logf("a flood of %d flows in %v holds %d conntrack entries (rate %d/s, at most %d expected)", flood, took, held, rate, most)
	if held > most {
		t.Errorf("the flooding sandbox opened %d flows in %v; want at most %d at %d/s", held, took, most, rate)
	}
	testhost.DoInNetNS(t, witness.NetNSPath, func() {
		for i := range 20 {
			if saw, err := dialReachable(target.String(), netip.Addr{}); err != nil || saw != "witness" {
				t.Fatalf("witness connection %d: %q, %v", i, saw, err)
			}
		}
	})
}

// BenchmarkUDPFloodHeld reports how many conntrack entries one sandbox
// holds after sending one datagram to each of 60000 ports of an
// "internet" host, with no bound, with the default connection bound only,
// and with the default bounds (connections and rate).
func BenchmarkUDPFloodHeld(b *testing.B) {
	const flood = 60000
	for _, c := range []struct {
		name           string
		maxConns, rate int
	}{
		{"unbounded", -1, -1},
		{fmt.Sprintf("max-conns=%d", DefaultMaxConns), 0, -1},
		{fmt.Sprintf("max-conns=%d,rate=%d", DefaultMaxConns, DefaultConnRate), 0, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := newFloodHost(b, "wbchf")
			m, err := New(Config{Prefix: "wbch", CIDR: netip.MustParsePrefix("10.123.0.0/16"), PoolSize: -1, MaxConns: c.maxConns, ConnRate: c.rate})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := m.Destroy(); err != nil {
					b.Error(err)
				}
			}()
			var held int
			for b.Loop() {
				b.StopTimer()
				s, err := m.Acquire(b.Context())
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				floodUDP(b, s, h.Addr, flood)
				b.StopTimer()
				held = flowsFrom(b, s.SandboxIP)
				if err := m.deleteFlows(flowsOf{s.SandboxIP: true}); err != nil {
					b.Fatal(err)
				}
				if err := m.Release(s); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(held), "conntrack-entries")
		})
	}
}

func TestConnBoundsConfig(t *testing.T) {
	for _, c := range []struct{ in, wantConns, wantRate int }{
		{0, DefaultMaxConns, DefaultConnRate},
		{-7, -1, -1},
		{300, 300, 300},
	} {
		got, err := Config{MaxConns: c.in, ConnRate: c.in}.normalize()
		if err != nil {
			t.Fatal(err)
		}
		if got.MaxConns != c.wantConns || got.ConnRate != c.wantRate {
			t.Errorf("%d: MaxConns %d, ConnRate %d; want %d, %d", c.in, got.MaxConns, got.ConnRate, c.wantConns, c.wantRate)
		}
	}
}
