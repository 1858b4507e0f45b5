package network

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/network/testhost"
	"github.com/warren-sandbox/warren/internal/poll"
)

func TestConfigNames(t *testing.T) {
	c, err := Config{}.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if c.CIDR != DefaultCIDR || c.Prefix != DefaultPrefix || c.PoolSize != DefaultPoolSize {
		t.Errorf("defaults: %+v", c)
	}
	last := c.slot(c.slotCount() - 1)
	if last.HostVeth != "wrnv16383" || last.NetNSPath != "/var/run/netns/wrn-16383" ||
		last.HostIP.String() != "10.11.255.253" || last.SandboxIP.String() != "10.11.255.254" {
		t.Errorf("last slot: %+v", last)
	}
	if id, ok := c.parseID("wrnv16383", "v"); !ok || id != 16383 {
		t.Errorf("parseID: %d %v", id, ok)
	}
	for _, bad := range []string{"wrnv16384", "wrnv01", "wrn-x", "wrnvv1", "wrn-"} {
		if _, ok := c.parseID(bad, bad[3:4]); ok {
			t.Errorf("parseID accepted %q", bad)
		}
	}
	// The longest veth name must fit IFNAMSIZ: "warrenxv4194303" does.
	if _, err := (Config{Prefix: "warrenx", CIDR: netip.MustParsePrefix("10.0.0.0/8")}).normalize(); err != nil {
		t.Error(err)
	}
	for _, bad := range []Config{
		{Prefix: "Wrn"}, {Prefix: "1wr"}, {Prefix: "w-r"},
		{Prefix: "abcdefghij"}, // "abcdefghijv16383" has 16 characters
		{CIDR: netip.MustParsePrefix("10.0.0.0/31")},
		{CIDR: netip.MustParsePrefix("fd00::/64")},
	} {
		if _, err := bad.normalize(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestReleaseLeavesNothing(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: -1})
	a, b := acquire(t, m), acquire(t, m)
	for _, s := range []*Slot{a, b} {
		if err := m.Release(s); err != nil {
			t.Fatal(err)
		}
		if err := m.Release(s); err != nil { // twice: harmless
			t.Fatal(err)
		}
	}
	if left := leftovers(t, testPrefix); len(left) != 2 { // the two tables only
		t.Errorf("after Release: %v", left)
	}
	if n := inUse(m); n != 0 {
		t.Errorf("%d ids still reserved", n)
	}
	// A stale *Slot whose /30 went to a new slot must not tear that one down.
	c := acquire(t, m)
	stale := *c
	if err := m.Release(&stale); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.NetNSPath); err != nil {
		t.Errorf("releasing a copy tore the slot down: %v", err)
	}
	if err := m.Release(c); err != nil {
		t.Fatal(err)
	}
}

// A build that fails at any step leaves nothing and frees its /30.
func TestFailedBuildLeavesNothing(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: -1})
	t.Cleanup(func() { testHook = nil })
	for _, step := range []string{"netns", "veth", "host address", "inside"} {
		testHook = func(s string) error {
			if s == step {
				return errors.New("injected")
			}
			return nil
		}
		if s, err := m.Acquire(context.Background()); err == nil {
			m.Release(s)
			t.Fatalf("Acquire succeeded despite a failure at %q", step)
		}
		if left := leftovers(t, testPrefix); len(left) != 2 {
			t.Errorf("failure at %q left %v", step, left)
		}
		if n := inUse(m); n != 0 {
			t.Errorf("failure at %q kept %d ids", step, n)
		}
	}
	testHook = nil
	m.Release(acquire(t, m))
}

// Concurrent Acquires get distinct /30s until the range runs out.
func TestConcurrentAcquire(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: -1, CIDR: netip.MustParsePrefix("10.123.0.0/27")}) // 8 slots
	const callers = 12
	var wg sync.WaitGroup
	slots := make(chan *Slot, callers)
	errs := make(chan error, callers)
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.Acquire(context.Background())
			if err != nil {
				errs <- err
				return
			}
			slots <- s
		}()
	}
	wg.Wait()
	close(slots)
	close(errs)
	seen := map[netip.Addr]bool{}
	for s := range slots {
		if seen[s.SandboxIP] {
			t.Errorf("%s handed out twice", s.SandboxIP)
		}
		seen[s.SandboxIP] = true
		defer m.Release(s)
	}
	if len(seen) != 8 {
		t.Errorf("%d slots handed out, want 8", len(seen))
	}
	for err := range errs {
		if !errors.Is(err, ErrExhausted) {
			t.Errorf("unexpected error: %v", err)
		}
	}
}

func TestRestoreAddress(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: -1})
	s := acquire(t, m)
	defer m.Release(s)
	inside := func() *netlink.Handle {
		ns, err := netns.GetFromPath(s.NetNSPath)
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := inside()
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	// What runsc does to the namespace: the address goes, and with it the
	// default route; eth0 may be left down.
	if err := h.AddrDel(eth0, ipNet(s.SandboxIP, s.PrefixLen)); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetDown(eth0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // idempotent
		if err := s.RestoreAddress(); err != nil {
			t.Fatalf("RestoreAddress #%d: %v", i+1, err)
		}
	}
	addrs, err := h.AddrList(eth0, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || !addrs[0].IP.Equal(s.SandboxIP.AsSlice()) {
		t.Errorf("eth0 addresses after restore: %v", addrs)
	}
	routes, err := h.RouteList(nil, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	var gw net.IP
	for _, r := range routes {
		if r.Gw != nil {
			gw = r.Gw
		}
	}
	if !gw.Equal(s.HostIP.AsSlice()) {
		t.Errorf("default route after restore: %v", routes)
	}
	var port int
	testhost.DoInNetNS(t, s.NetNSPath, func() { port = listen(t, "0.0.0.0:0").Port })
	if _, err := dialReachable(hostPort(s.SandboxIP, port), netip.Addr{}); err != nil {
		t.Errorf("host → sandbox after restore: %v", err)
	}
}

// Close keeps the tables while slots are out: their sandboxes may outlive
// the process and must stay isolated.
func TestCloseKeepsRulesForSlotsInUse(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: 2})
	s := acquire(t, m)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close: %v", err)
	}
	left := leftovers(t, testPrefix)
	if len(left) != 5 { // s's netns, mount and veth, both tables; the pool is gone
		t.Errorf("after Close with a slot out: %v", left)
	}
	if err := m.Release(s); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(); err != nil {
		t.Fatal(err)
	}
}

// inUse counts the ids that are neither free nor merely waiting for a
// conntrack flush.
func inUse(m *Manager) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, e := range m.ids {
		if e.state != stateDirty {
			n++
		}
	}
	return n
}

// A connection the host still holds open to a released sandbox must not
// be usable by the next sandbox with that address: its conntrack flow is
// gone before the address is handed out again.
func TestReusedAddressInheritsNoFlows(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: -1, CIDR: netip.MustParsePrefix("10.123.0.0/30")}) // one slot
	s := acquire(t, m)
	var port int
	testhost.DoInNetNS(t, s.NetNSPath, func() { port = listen(t, "0.0.0.0:0").Port })
	var conn net.Conn
	var err error
	poll.Within(reachTimeout, 20*time.Millisecond, func() bool {
		conn, err = net.DialTimeout("tcp4", hostPort(s.SandboxIP, port), probeTimeout)
		return err == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close() // held open across the release, like a proxy might
	if n := flowsTo(t, s.SandboxIP); n == 0 {
		t.Fatal("no conntrack flow for the open connection")
	}
	if err := m.Release(s); err != nil {
		t.Fatal(err)
	}
	again := acquire(t, m)
	defer m.Release(again)
	if again.SandboxIP != s.SandboxIP {
		t.Fatalf("got %s, want the only address %s again", again.SandboxIP, s.SandboxIP)
	}
	if n := flowsTo(t, s.SandboxIP); n != 0 {
		t.Errorf("%d conntrack flows of the previous sandbox survive into the new one", n)
	}
}

// TestReleasedAddressIsUnreachable checks that the host's packets to a
// released sandbox address (a connection the proxy still held, say) fail
// at once with EHOSTUNREACH instead of leaving through the default route
// towards a private address outside the machine.
func TestReleasedAddressIsUnreachable(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: -1, CIDR: netip.MustParsePrefix("10.123.0.0/29")}) // two slots
	s := acquire(t, m)
	if err := m.Release(s); err != nil {
		t.Fatal(err)
	}
	if dev, err := testhost.RouteDev(s.SandboxIP); err == nil {
		t.Fatalf("the released address %s routes through %q", s.SandboxIP, dev)
	}
	start := time.Now()
	_, err := net.DialTimeout("tcp4", hostPort(s.SandboxIP, 80), 5*time.Second)
	if !errors.Is(err, unix.EHOSTUNREACH) {
		t.Fatalf("dial of a released address: %v, want EHOSTUNREACH", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the dial failed only after %v", d)
	}
}

func flowsTo(t *testing.T, ip netip.Addr) int {
	t.Helper()
	flows, err := whole(func() ([]*netlink.ConntrackFlow, error) {
		return netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Forward.DstIP.Equal(ip.AsSlice()) || f.Forward.SrcIP.Equal(ip.AsSlice()) {
			n++
		}
	}
	return n
}

// Acquire and Release racing on a small range with a pool: the range runs
// out, released /30s are flushed and reused, and no /30 is ever held twice.
func TestChurn(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: 2, CIDR: netip.MustParsePrefix("10.123.0.0/28")}) // 4 slots
	var mu sync.Mutex
	held := map[netip.Addr]bool{}
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < 8; {
				s, err := m.Acquire(context.Background())
				if errors.Is(err, ErrExhausted) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if held[s.SandboxIP] {
					t.Errorf("%s handed out while held", s.SandboxIP)
				}
				held[s.SandboxIP] = true
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				delete(held, s.SandboxIP)
				mu.Unlock()
				if err := m.Release(s); err != nil {
					t.Error(err)
				}
				done++
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(60 * time.Second):
		t.Fatal("churn did not finish within 60 s")
	}
}
