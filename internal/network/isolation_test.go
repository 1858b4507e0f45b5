package network

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/network/testhost"
)

// The test's stand-in for the outside world: a namespace of its own behind
// a veth that the manager is told is its uplink, at an "internet" address
// (198.18.0.0/15, benchmarking, never routed outside). It has no route to
// the slots' range, so a slot can only get an answer from it through NAT.
const (
	upName  = testPrefix + "up" // not "<prefix>-<n>": no slot name
	upVeth  = testPrefix + "u0" // not "<prefix>v<n>": not matched as a slot
	upNetNS = netnsDir + "/" + upName
)

var (
	upHostIP = netip.MustParseAddr("198.18.122.1")
	upFarIP  = netip.MustParseAddr("198.18.122.2")
)

func newUplink(t *testing.T) {
	t.Helper()
	needRoot(t)
	_ = deleteNamedNetns(upNetNS) // from an interrupted earlier run
	if l, err := netlink.LinkByName(upVeth); err == nil {
		_ = netlink.LinkDel(l)
	}
	ns, h, err := newNamedNetns(upNetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	defer h.Close()
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(upVeth); err == nil {
			_ = netlink.LinkDel(l)
		}
		if err := deleteNamedNetns(upNetNS); err != nil {
			t.Error(err)
		}
	})
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: upVeth, Flags: net.FlagUp}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(veth, ipNet(upHostIP, 30)); err != nil {
		t.Fatal(err)
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(eth0, ipNet(upFarIP, 30)); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
}

func TestReachabilityAndIsolation(t *testing.T) {
	newUplink(t)
	m := newTestManager(t, Config{PoolSize: -1, Uplink: upVeth})
	a, b := acquire(t, m), acquire(t, m)
	defer m.Release(a)
	defer m.Release(b)
	if a.SandboxIP == b.SandboxIP || a.HostIP.Next() != a.SandboxIP || !m.cfg.CIDR.Contains(b.SandboxIP) {
		t.Fatalf("addresses: a %+v, b %+v", a, b)
	}

	var portA, portB, portUp int
	testhost.DoInNetNS(t, a.NetNSPath, func() { portA = listen(t, "0.0.0.0:0").Port })
	testhost.DoInNetNS(t, b.NetNSPath, func() { portB = listen(t, "0.0.0.0:0").Port })
	var udpUp *net.UDPConn
	testhost.DoInNetNS(t, upNetNS, func() {
		portUp = listen(t, "0.0.0.0:0").Port
		var err error
		if udpUp, err = net.ListenUDP("udp4", &net.UDPAddr{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { udpUp.Close() })
	})
	hostAny := listen(t, "0.0.0.0:0").Port           // a host service on every host address
	hostLoop := listen(t, "127.0.0.1:0").Port        // a host service on loopback only
	hostGw := listen(t, a.HostIP.String()+":0").Port // one on the slot's gateway address only

	// The host, where the platform runs, dials into sandboxes; the
	// replies get through the input filter.
	for _, s := range []struct {
		slot *Slot
		port int
	}{{a, portA}, {b, portB}} {
		if _, err := dialReachable(hostPort(s.slot.SandboxIP, s.port), netip.Addr{}); err != nil {
			t.Errorf("host → %s: %v", s.slot.Name, err)
		}
	}

	testhost.DoInNetNS(t, a.NetNSPath, func() {
		mustFail := func(what, addr string, from netip.Addr) {
			t.Helper()
			if saw, err := dial(addr, from); err == nil {
				t.Errorf("sandbox reached %s at %s (server saw %s)", what, addr, saw)
			}
		}
		// A sandbox talks to itself over loopback (envd and user code do).
		if _, err := dialReachable(hostPort(netip.MustParseAddr("127.0.0.1"), portA), netip.Addr{}); err != nil {
			t.Errorf("sandbox loopback: %v", err)
		}
		// Host services: on the slot's gateway, on the host's other
		// addresses, and on loopback (which from a sandbox is its own).
		mustFail("a host service on its gateway", hostPort(a.HostIP, hostGw), netip.Addr{})
		mustFail("a host service via its gateway", hostPort(a.HostIP, hostAny), netip.Addr{})
		mustFail("a host service on another host address", hostPort(upHostIP, hostAny), netip.Addr{})
		mustFail("a host service on another slot's gateway", hostPort(b.HostIP, hostAny), netip.Addr{})
		mustFail("a host loopback service", hostPort(netip.MustParseAddr("127.0.0.1"), hostLoop), netip.Addr{})
		// Other sandboxes.
		mustFail("another sandbox", hostPort(b.SandboxIP, portB), netip.Addr{})

		// The outside, through NAT: the far end sees the host's address.
		saw, err := dialReachable(hostPort(upFarIP, portUp), netip.Addr{})
		if err != nil {
			t.Errorf("sandbox → outside: %v", err)
		} else if saw != upHostIP.String() {
			t.Errorf("outside saw the sandbox as %s, want the masqueraded %s", saw, upHostIP)
		}

		// Posing as another sandbox: the anti-spoofing rule drops the
		// packet before NAT would carry it out. UDP, because a spoofed
		// TCP handshake fails anyway (the answer goes to the real owner).
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.AddrAdd(eth0, ipNet(b.SandboxIP, 32)); err != nil {
			t.Fatal(err)
		}
		if !datagramArrives(t, a.SandboxIP, udpUp) {
			t.Error("a datagram from the sandbox's own address did not get out")
		}
		if datagramArrives(t, b.SandboxIP, udpUp) {
			t.Error("a datagram with another sandbox's source address got out")
		}
		if err := netlink.AddrDel(eth0, ipNet(b.SandboxIP, 32)); err != nil {
			t.Fatal(err)
		}

		// No IPv6 on eth0: no link-local path to the host.
		addrs, err := netlink.AddrList(eth0, unix.AF_INET6)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) > 0 {
			t.Errorf("eth0 has IPv6 addresses: %v", addrs)
		}
	})
}

// With no uplink configured, New picks the default route's interface.
func TestDefaultUplink(t *testing.T) {
	needRoot(t)
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	name, err := defaultUplink(h)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := netlink.RouteGet(net.IPv4(203, 0, 113, 1)) // a route lookup (TEST-NET-3); nothing is sent
	if err != nil || len(routes) == 0 || routes[0].Gw == nil {
		if name != "" {
			t.Errorf("no default route here, but found uplink %q", name)
		}
		t.Skip("host has no default route")
	}
	link, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		t.Fatal(err)
	}
	if name != link.Attrs().Name {
		t.Errorf("uplink %q, default route goes out of %q", name, link.Attrs().Name)
	}
	m := newTestManager(t, Config{PoolSize: -1})
	if m.uplink != name {
		t.Errorf("manager uses uplink %q, want %q", m.uplink, name)
	}
}

// datagramArrives sends a datagram from the calling thread's namespace,
// from address from, to the socket to, and reports whether it arrived.
func datagramArrives(t *testing.T, from netip.Addr, to *net.UDPConn) bool {
	t.Helper()
	dst := netip.AddrPortFrom(upFarIP, uint16(to.LocalAddr().(*net.UDPAddr).Port))
	c, err := net.DialUDP("udp4", &net.UDPAddr{IP: from.AsSlice()}, net.UDPAddrFromAddrPort(dst))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := "from " + from.String()
	if _, err := c.Write([]byte(want)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	for {
		_ = to.SetReadDeadline(time.Now().Add(probeTimeout))
		n, err := to.Read(buf)
		if err != nil {
			return false // nothing (more) within the timeout
		}
		if string(buf[:n]) == want {
			return true
		}
	}
}
