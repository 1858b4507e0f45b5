package network

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// Refused keeps the kernel's "not the host's" answers, so an address the
// host gains must be refused as soon as its route appears, and freed
// again when it goes. No traffic is sent: only route lookups.
func TestRefusedFollowsTheHostsAddresses(t *testing.T) {
	m := newTestManager(t, Config{})
	addr := netip.MustParseAddr("198.19.254.77")
	if m.Refused(addr) || m.Refused(addr) {
		t.Fatalf("%s refused before the host has it", addr)
	}
	// A veth that stays down: its address still gets a local route.
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: testPrefix + "lcl0"}, PeerName: testPrefix + "lcl1"}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(link) })
	a := &netlink.Addr{IPNet: netlink.NewIPNet(addr.AsSlice())}
	if err := netlink.AddrAdd(link, a); err != nil {
		t.Fatal(err)
	}
	if !eventually(func() bool { return m.Refused(addr) }) {
		t.Fatalf("%s not refused after the host took it", addr)
	}
	if err := netlink.AddrDel(link, a); err != nil {
		t.Fatal(err)
	}
	if !eventually(func() bool { return !m.Refused(addr) }) {
		t.Fatalf("%s still refused after the host gave it up", addr)
	}
}

// eventually polls cond for up to two seconds (the route event's way to
// the manager is asynchronous).
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
