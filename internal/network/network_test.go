package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Tests use their own prefix and range so they never touch a running Warren.
func newTestManager(t *testing.T, pool int) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network slots need root")
	}
	m, err := New(Config{CIDR: netip.MustParsePrefix("10.123.0.0/16"), Prefix: "wtst", PoolSize: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		assertNothingLeft(t, m)
	})
	return m
}

// inNetns runs f on a throwaway OS thread inside the namespace at path.
// Sockets f opens stay in that namespace whatever thread uses them later.
func inNetns(t *testing.T, path string, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		f()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func serve(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
}

func reachable(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 400*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(400 * time.Millisecond))
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil {
		return err
	}
	return nil
}

func TestSlotReachabilityAndIsolation(t *testing.T) {
	m := newTestManager(t, -1)
	a, err := m.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if a.SandboxIP == b.SandboxIP || !m.cfg.CIDR.Contains(a.SandboxIP) || a.HostIP.Next() != a.SandboxIP {
		t.Fatalf("addresses: a %+v b %+v", a, b)
	}
	inNetns(t, a.NetNSPath, func() {
		ln, err := net.Listen("tcp", "0.0.0.0:8080")
		if err != nil {
			t.Error(err)
			return
		}
		serve(t, ln)
	})
	inNetns(t, b.NetNSPath, func() {
		ln, err := net.Listen("tcp", "0.0.0.0:8081")
		if err != nil {
			t.Error(err)
			return
		}
		serve(t, ln)
	})
	hostLn, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, hostLn)
	hostPort := hostLn.Addr().(*net.TCPAddr).Port

	// The host (where the platform runs) reaches into a sandbox.
	if err := reachable(fmt.Sprintf("%s:8080", a.SandboxIP)); err != nil {
		t.Errorf("host → sandbox a: %v", err)
	}
	inNetns(t, a.NetNSPath, func() {
		// Own loopback works: envd and user processes talk locally.
		if err := reachable("127.0.0.1:8080"); err != nil {
			t.Errorf("sandbox loopback: %v", err)
		}
		// Host services are out of reach, on the slot's host address...
		if err := reachable(fmt.Sprintf("%s:%d", a.HostIP, hostPort)); err == nil {
			t.Error("sandbox reached a host service on its gateway address")
		}
		// ...and on any other host address.
		for _, ip := range hostAddrs(t) {
			if err := reachable(net.JoinHostPort(ip, fmt.Sprint(hostPort))); err == nil {
				t.Errorf("sandbox reached a host service on %s", ip)
			}
		}
		// Other sandboxes are out of reach.
		if err := reachable(fmt.Sprintf("%s:8081", b.SandboxIP)); err == nil {
			t.Error("sandbox a reached sandbox b")
		}
	})
	for _, s := range []*Slot{a, b} {
		if err := m.Release(s); err != nil {
			t.Errorf("Release: %v", err)
		}
		if err := m.Release(s); err != nil {
			t.Errorf("second Release: %v", err)
		}
	}
}

// hostAddrs lists the host's non-loopback IPv4 addresses outside our range.
func hostAddrs(t *testing.T) []string {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		if !ip.IsLoopback() && !netip.MustParsePrefix("10.123.0.0/16").Contains(ip) {
			out = append(out, ip.String())
		}
	}
	return out
}

func TestRestoreAddressIsIdempotent(t *testing.T) {
	m := newTestManager(t, -1)
	s, err := m.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(s)
	// Take the address away, as runsc does, then put it back twice.
	ns, _ := netns.GetFromPath(s.NetNSPath)
	h, _ := netlink.NewHandleAt(ns)
	eth0, _ := h.LinkByName("eth0")
	if err := h.AddrDel(eth0, addr(s.SandboxIP.AsSlice(), s.PrefixLen)); err != nil {
		t.Fatal(err)
	}
	h.Close()
	ns.Close()
	if err := reachable(fmt.Sprintf("%s:1", s.SandboxIP)); err == nil {
		t.Fatal("address still answers after removal")
	}
	for i := 0; i < 2; i++ {
		if err := s.RestoreAddress(); err != nil {
			t.Fatalf("RestoreAddress #%d: %v", i+1, err)
		}
	}
	inNetns(t, s.NetNSPath, func() {
		ln, err := net.Listen("tcp", "0.0.0.0:8080")
		if err != nil {
			t.Error(err)
			return
		}
		serve(t, ln)
	})
	// The failed probe above left an unresolved ARP entry on the host; the
	// kernel retries it once a second, so allow a few seconds.
	var err2 error
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); {
		if err2 = reachable(fmt.Sprintf("%s:8080", s.SandboxIP)); err2 == nil {
			break
		}
	}
	if err2 != nil {
		t.Errorf("after RestoreAddress: %v", err2)
	}
}

func TestPoolAndCleanup(t *testing.T) {
	m := newTestManager(t, 2)
	deadline := time.Now().Add(5 * time.Second)
	for len(m.pool) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if len(m.pool) != 2 {
		t.Fatalf("pool has %d ready slots, want 2", len(m.pool))
	}
	s, err := m.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A slot of a "crashed run": built, then forgotten by the manager.
	orphan, err := m.create()
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	delete(m.used, orphan.ID)
	m.mu.Unlock()
	if err := m.Cleanup(func(name string) bool { return name == s.Name }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan.NetNSPath); !os.IsNotExist(err) {
		t.Errorf("leftover netns %s survived Cleanup", orphan.Name)
	}
	if _, err := netlink.LinkByName(orphan.HostVeth); err == nil {
		t.Errorf("leftover veth %s survived Cleanup", orphan.HostVeth)
	}
	if _, err := os.Stat(s.NetNSPath); err != nil {
		t.Errorf("Cleanup removed a slot in use: %v", err)
	}
	if err := m.Release(s); err != nil {
		t.Fatal(err)
	}
}

// assertNothingLeft lists namespaces, links and tables with the test prefix.
func assertNothingLeft(t *testing.T, m *Manager) {
	t.Helper()
	entries, _ := os.ReadDir(netnsDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), m.cfg.Prefix+"-") {
			t.Errorf("netns %s left behind", e.Name())
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, m.cfg.Prefix+"v") {
			t.Errorf("link %s left behind", l.Attrs().Name)
		}
	}
	if tables, err := m.tablesPresent(); err != nil || len(tables) > 0 {
		t.Errorf("nftables tables left: %v (err %v)", tables, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), netnsDir+"/"+m.cfg.Prefix+"-") {
		t.Error("netns mount left behind")
	}
}

func BenchmarkSlotSetup(b *testing.B) {
	m, err := New(Config{CIDR: netip.MustParsePrefix("10.123.0.0/16"), Prefix: "wbch", PoolSize: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Destroy()
	for i := 0; i < b.N; i++ {
		s, err := m.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		m.Release(s)
		b.StartTimer()
	}
}

// BenchmarkAcquireFromPool reports the time Acquire takes when the pool
// has a ready slot (the refill that follows is not counted).
func BenchmarkAcquireFromPool(b *testing.B) {
	m, err := New(Config{CIDR: netip.MustParsePrefix("10.123.0.0/16"), Prefix: "wbch", PoolSize: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Destroy()
	var acquiring time.Duration
	for i := 0; i < b.N; i++ {
		for deadline := time.Now().Add(2 * time.Second); len(m.pool) == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		start := time.Now()
		s, err := m.Acquire(context.Background())
		acquiring += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		m.Release(s)
	}
	b.ReportMetric(float64(acquiring.Nanoseconds())/float64(b.N), "ns/acquire")
}
