package network

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/network/testhost"
)

// A second "internet" host, for policies that tell two apart.
var otherPublicHost = netip.MustParsePrefix("198.18.1.2/30")

// serveEcho answers each line with itself on a port of h, until the test
// ends; it returns the address.
func serveEcho(t *testing.T, h *testhost.Host) netip.AddrPort {
	t.Helper()
	ln, err := h.ListenTCP(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintln(c, sc.Text())
				}
			}()
		}
	}()
	return netip.AddrPortFrom(h.Addr, uint16(ln.Addr().(*net.TCPAddr).Port))
}

// echoConn is an open connection to an echo server and its round trip.
type echoConn struct {
	c  net.Conn
	rd *bufio.Reader
}

func (e *echoConn) roundTrip(msg string) error {
	_ = e.c.SetDeadline(time.Now().Add(reachTimeout))
	if _, err := fmt.Fprintln(e.c, msg); err != nil {
		return err
	}
	line, err := e.rd.ReadString('\n')
	if err == nil && line != msg+"\n" {
		err = fmt.Errorf("echoed %q", line)
	}
	return err
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func mustSetPolicy(t *testing.T, m *Manager, s *Slot, p SlotPolicy) {
	t.Helper()
	if err := m.SetPolicy(s, p); err != nil {
		t.Fatal(err)
	}
}

func TestSlotPolicy(t *testing.T) {
	h := newEgressHosts(t)
	other := testhost.New(t, testPrefix+"x", otherPublicHost)
	otherPort := other.ServeTCP(t, 0, "other")
	otherAddr := netip.AddrPortFrom(other.Addr, uint16(otherPort))
	otherEcho := serveEcho(t, other)
	udp, err := other.ListenUDP(0)
	if err != nil {
		t.Fatal(err)
	}
	m := newTestManager(t, Config{PoolSize: -1, Resolvers: []netip.Addr{h.private.Addr}})
	s, bystander := acquire(t, m), acquire(t, m)

	var open *echoConn
	testhost.DoInNetNS(t, s.NetNSPath, func() {
		mustReach(t, "an internet host", h.publicAddr(), "public")
		mustReach(t, "another internet host", otherAddr, "other")
		c, err := net.DialTimeout("tcp4", otherEcho.String(), reachTimeout)
		if err != nil {
			t.Fatal(err)
		}
		open = &echoConn{c: c, rd: bufio.NewReader(c)}
	})
	defer open.c.Close()
	if err := open.roundTrip("before"); err != nil {
		t.Fatal(err)
	}

	// Deny everything but one host: allow wins over deny. The node's
	// rules still come first (DNS to the resolver works), and the open
	// connection to the other host is cut.
	mustSetPolicy(t, m, s, SlotPolicy{Deny: prefixes("0.0.0.0/0"), Allow: prefixes(h.public.Addr.String() + "/32")})
	if err := open.roundTrip("after"); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("an open connection the new policy denies: %v; want it reset", err)
	}
	testhost.DoInNetNS(t, s.NetNSPath, func() {
		mustReach(t, "the allowed host", h.publicAddr(), "public")
		mustBeRefused(t, "a denied host", otherAddr)
		mustResolve(t, h.private.Addr)
		c, err := net.DialUDP("udp4", nil, udp.LocalAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Write([]byte("x"))
		_ = c.SetReadDeadline(time.Now().Add(probeTimeout))
		if _, err := c.Read(make([]byte, 8)); !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("UDP to a denied host: %v; want host unreachable (administratively prohibited)", err)
		}
	})
	// Another slot is not affected.
	testhost.DoInNetNS(t, bystander.NetNSPath, func() { mustReach(t, "the other host from another slot", otherAddr, "other") })

	// The other way round, then a thousand ranges, then nothing.
	mustSetPolicy(t, m, s, SlotPolicy{Deny: prefixes(h.public.Addr.String() + "/32")})
	testhost.DoInNetNS(t, s.NetNSPath, func() {
		mustBeRefused(t, "the now denied host", h.publicAddr())
		mustReach(t, "the now allowed host", otherAddr, "other")
	})
	var many []netip.Prefix
	for i := 0; i < 1000; i++ {
		many = append(many, netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), 32))
	}
	many = append(many, netip.PrefixFrom(other.Addr, 32))
	mustSetPolicy(t, m, s, SlotPolicy{Deny: prefixes("0.0.0.0/0"), Allow: many})
	testhost.DoInNetNS(t, s.NetNSPath, func() {
		mustReach(t, "a host among 1001 allowed ranges", otherAddr, "other")
		mustBeRefused(t, "a host outside them", h.publicAddr())
	})
	mustSetPolicy(t, m, s, SlotPolicy{})
	testhost.DoInNetNS(t, s.NetNSPath, func() {
		mustReach(t, "an internet host without a policy", h.publicAddr(), "public")
		mustReach(t, "another internet host without a policy", otherAddr, "other")
	})
	// A policy never opens what the node refuses.
	mustSetPolicy(t, m, s, SlotPolicy{Allow: prefixes("0.0.0.0/0")})
	testhost.DoInNetNS(t, s.NetNSPath, func() {
		mustBeRefused(t, "a private host allowed by the slot policy", h.privateAddr())
		mustBeRefused(t, "the metadata address allowed by the slot policy", h.metadataAddr())
	})
	if err := m.Release(s); err != nil {
		t.Fatal(err)
	}
	if err := m.SetPolicy(s, SlotPolicy{Deny: prefixes("0.0.0.0/0")}); err == nil {
		t.Error("SetPolicy on a released slot succeeded")
	}
}

// A restarted manager keeps running sandboxes' policies: New carries them
// over in the transaction that replaces the tables.
func TestSlotPolicySurvivesRestart(t *testing.T) {
	h := newEgressHosts(t)
	cfg := Config{PoolSize: -1, Prefix: testPrefix, CIDR: netip.MustParsePrefix(testCIDR)}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mustSetPolicy(t, m, s, SlotPolicy{Deny: prefixes(h.public.Addr.String() + "/32")})
	if err := m.Close(); err != nil { // keeps the tables: a slot is out
		t.Fatal(err)
	}
	m2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m2.Destroy(); err != nil {
			t.Error(err)
		}
		if left := leftovers(t, testPrefix); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	})
	if err := m2.Cleanup(func(name string) bool { return name == s.Name }); err != nil {
		t.Fatal(err)
	}
	adopted, ok := m2.Adopt(s.Name)
	if !ok {
		t.Fatal("Adopt failed")
	}
	testhost.DoInNetNS(t, adopted.NetNSPath, func() { mustBeRefused(t, "a denied host after the restart", h.publicAddr()) })
	mustSetPolicy(t, m2, adopted, SlotPolicy{})
	testhost.DoInNetNS(t, adopted.NetNSPath, func() { mustReach(t, "the host once the policy is cleared", h.publicAddr(), "public") })
	mustSetPolicy(t, m2, adopted, SlotPolicy{Deny: prefixes("0.0.0.0/0")})
	if err := m2.Release(adopted); err != nil {
		t.Fatal(err)
	}
}

func TestRefused(t *testing.T) {
	h := newEgressHosts(t)
	m := newTestManager(t, Config{PoolSize: -1, AllowPrivate: prefixes("10.201.0.0/24")})
	s := acquire(t, m)
	for a, want := range map[string]bool{
		h.public.Addr.String(): false, h.private.Addr.String(): false, // allowed private
		h.metadata.Addr.String(): true, "127.0.0.1": true, "10.202.0.1": true, "0.0.0.0": true,
		s.SandboxIP.String(): true, s.HostIP.String(): true, h.public.Gateway.String(): true, "::1": true, "2001:db8::1": true,
	} {
		if got := m.Refused(netip.MustParseAddr(a)); got != want {
			t.Errorf("Refused(%s) = %v, want %v", a, got, want)
		}
	}
}

// The egress proxy's port takes the connections redirected to it from a
// proxied slot, and nothing else: not the host itself, not a machine on
// another link (a test host), not a sandbox dialling its gateway at that
// port. (The proxy listens on every address; these rules are its door.)
func TestProxyPortTakesOnlyRedirectedConnections(t *testing.T) {
	needRoot(t)
	other := testhost.New(t, testPrefix+"w", publicHost)
	otherPort := other.ServeTCP(t, 0, "public")
	proxy := listen(t, "0.0.0.0:0") // answers with the client's address
	port := uint16(proxy.Port)
	atPort := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, port) }
	// Without the rules every one of them gets in: the probes work.
	if _, err := dial(atPort(netip.MustParseAddr("127.0.0.1")).String(), netip.Addr{}); err != nil {
		t.Fatalf("the port does not answer the host before the rules: %v", err)
	}
	testhost.DoInNetNS(t, other.NetNSPath, func() {
		if _, err := dialReachable(atPort(other.Gateway).String(), netip.Addr{}); err != nil {
			t.Fatalf("the port does not answer the test host before the rules: %v", err)
		}
	})

	m := newTestManager(t, Config{PoolSize: -1, ProxyPort: port})
	plain, proxied := acquire(t, m), acquire(t, m)
	mustSetPolicy(t, m, proxied, SlotPolicy{Proxy: true})
	mustBeRefused(t, "the proxy port, from the host itself", atPort(netip.MustParseAddr("127.0.0.1")))
	testhost.DoInNetNS(t, other.NetNSPath, func() {
		mustBeRefused(t, "the proxy port, from another machine", atPort(other.Gateway))
	})
	testhost.DoInNetNS(t, plain.NetNSPath, func() {
		mustBeRefused(t, "the proxy port, from a sandbox dialling its gateway", atPort(plain.HostIP))
	})
	testhost.DoInNetNS(t, proxied.NetNSPath, func() {
		mustBeRefused(t, "the proxy port, from a proxied sandbox dialling its gateway", atPort(proxied.HostIP))
		// Its connection to the internet host is redirected to the port.
		saw, err := dialReachable(netip.AddrPortFrom(other.Addr, uint16(otherPort)).String(), netip.Addr{})
		if err != nil || saw != proxied.SandboxIP.String() {
			t.Errorf("a proxied sandbox's connection: %q, %v; want it redirected to the proxy port (which answers %s)", saw, err, proxied.SandboxIP)
		}
	})
}
