package network

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/network/testhost"
	"github.com/warren-sandbox/warren/internal/poll"
)

func TestBlockedIntervals(t *testing.T) {
	str := func(rs []addrRange) string {
		var s []string
		for _, r := range rs {
			s = append(s, addrOf(r.first).String()+"-"+addrOf(r.last).String())
		}
		return strings.Join(s, " ")
	}
	for _, c := range []struct {
		allow []string
		want  string
	}{
		{nil, "0.0.0.0-0.255.255.255 10.0.0.0-10.255.255.255 100.64.0.0-100.127.255.255 127.0.0.0-127.255.255.255 " +
			"169.254.0.0-169.254.255.255 172.16.0.0-172.31.255.255 192.168.0.0-192.168.255.255 224.0.0.0-255.255.255.255"},
		// A hole in the middle of a range, and one at the start of another.
		{[]string{"10.201.0.0/24", "192.168.0.0/17"}, "0.0.0.0-0.255.255.255 10.0.0.0-10.200.255.255 10.201.1.0-10.255.255.255 " +
			"100.64.0.0-100.127.255.255 127.0.0.0-127.255.255.255 169.254.0.0-169.254.255.255 172.16.0.0-172.31.255.255 " +
			"192.168.128.0-192.168.255.255 224.0.0.0-255.255.255.255"},
		// Ranges wider than a blocked one, and the top of the address space.
		{[]string{"10.0.0.0/7", "169.254.169.254/32", "0.0.0.0/1", "255.255.255.255/32"}, "169.254.0.0-169.254.169.253 169.254.169.255-169.254.255.255 " +
			"172.16.0.0-172.31.255.255 192.168.0.0-192.168.255.255 224.0.0.0-255.255.255.254"},
	} {
		var allow []netip.Prefix
		for _, a := range c.allow {
			allow = append(allow, netip.MustParsePrefix(a))
		}
		if got := str(blockedIntervals(allow)); got != c.want {
			t.Errorf("allow %v:\n got %s\nwant %s", c.allow, got, c.want)
		}
	}
}

func TestEgressConfig(t *testing.T) {
	var l PrefixList
	for _, v := range []string{"10.201.0.0/24", " 172.31.0.0/16, 169.254.169.254/32,", "10.201.0.5/24"} {
		if err := l.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if l.String() != "10.201.0.0/24,172.31.0.0/16,169.254.169.254/32,10.201.0.5/24" {
		t.Errorf("PrefixList: %s", l.String())
	}
	for _, bad := range []string{"10.0.0.0", "10.0.0.0/33", "example.com/8"} {
		if err := new(PrefixList).Set(bad); err == nil {
			t.Errorf("PrefixList accepted %q", bad)
		}
	}
	c, err := Config{AllowPrivate: l, Resolvers: []netip.Addr{netip.MustParseAddr("10.255.255.53"), netip.MustParseAddr("10.255.255.53")}}.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(c.AllowPrivate) != "[10.201.0.0/24 169.254.169.254/32 172.31.0.0/16]" || fmt.Sprint(c.Resolvers) != "[10.255.255.53]" {
		t.Errorf("normalized: %v %v", c.AllowPrivate, c.Resolvers)
	}
	for _, bad := range []Config{
		{AllowPrivate: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}},
		{AllowPrivate: []netip.Prefix{netip.MustParsePrefix("8.8.8.0/24")}}, // public: a typo, most likely
		{Resolvers: []netip.Addr{netip.MustParseAddr("127.0.0.53")}},
		{Resolvers: []netip.Addr{netip.MustParseAddr("::1")}},
		{Resolvers: []netip.Addr{netip.MustParseAddr("2001:db8::1")}},
		{Resolvers: []netip.Addr{{}}},
	} {
		if _, err := bad.normalize(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// egressHosts are the test hosts the egress tests probe, each in a
// namespace of its own: a private one that also runs the DNS server, the
// cloud metadata address, and an "internet" one.
type egressHosts struct {
	private, metadata, public             *testhost.Host
	privatePort, metadataPort, publicPort int
	dns                                   *testhost.DNS
}

const probeName = "probe.warren.test"

var (
	privateHost  = netip.MustParsePrefix("10.201.0.2/24")
	metadataHost = netip.MustParsePrefix("169.254.169.254/30")
	publicHost   = netip.MustParsePrefix("198.18.0.2/30")
	probeAddr    = netip.MustParseAddr("198.18.0.99")
)

func newEgressHosts(t *testing.T) *egressHosts {
	t.Helper()
	needRoot(t)
	h := &egressHosts{
		private:  testhost.New(t, testPrefix+"p", privateHost),
		metadata: testhost.New(t, testPrefix+"m", metadataHost),
		public:   testhost.New(t, testPrefix+"w", publicHost),
	}
	h.privatePort = h.private.ServeTCP(t, 0, "private")
	h.metadataPort = h.metadata.ServeTCP(t, 80, "metadata")
	h.metadata.ServeTCP(t, 53, "metadata dns")
	h.publicPort = h.public.ServeTCP(t, 0, "public")
	h.dns = h.private.ServeDNS(t, map[string]netip.Addr{probeName: probeAddr})
	// The host reaches every one of them: what a sandbox cannot reach is
	// refused by the policy, not missing.
	for _, a := range []netip.AddrPort{h.privateAddr(), h.metadataAddr(), netip.AddrPortFrom(h.metadata.Addr, 53), h.publicAddr()} {
		if _, err := dialReachable(a.String(), netip.Addr{}); err != nil {
			t.Fatalf("test host %s does not answer the host: %v", a, err)
		}
	}
	return h
}

func (h *egressHosts) privateAddr() netip.AddrPort {
	return netip.AddrPortFrom(h.private.Addr, uint16(h.privatePort))
}
func (h *egressHosts) metadataAddr() netip.AddrPort {
	return netip.AddrPortFrom(h.metadata.Addr, uint16(h.metadataPort))
}
func (h *egressHosts) publicAddr() netip.AddrPort {
	return netip.AddrPortFrom(h.public.Addr, uint16(h.publicPort))
}

// mustBeRefused dials addr from the calling thread's namespace and wants
// the connection refused at once (a TCP reset), not reached and not
// hanging until the timeout. The namespace must have reached something
// through its gateway before: the first packet of a fresh slot waits for
// ARP, which may take a retry (a second) if the link was just raised.
func mustBeRefused(t *testing.T, what string, addr netip.AddrPort) {
	t.Helper()
	saw, err := dialWithin(addr.String(), netip.Addr{}, refusedTimeout)
	switch {
	case err == nil:
		t.Errorf("sandbox reached %s at %s (it answered %q)", what, addr, saw)
	case !errors.Is(err, syscall.ECONNREFUSED):
		t.Errorf("sandbox → %s at %s: %v; want the connection refused at once", what, addr, err)
	}
}

func mustReach(t *testing.T, what string, addr netip.AddrPort, want string) {
	t.Helper()
	if saw, err := dialReachable(addr.String(), netip.Addr{}); err != nil || saw != want {
		t.Errorf("sandbox → %s at %s: %q, %v; want %q", what, addr, saw, err, want)
	}
}

// mustResolve looks probeName up at the private test host's DNS server.
func mustResolve(t *testing.T, server netip.Addr) {
	t.Helper()
	for _, network := range []string{"udp", "tcp"} {
		var got netip.Addr
		var err error
		poll.Within(reachTimeout, 20*time.Millisecond, func() bool {
			got, err = testhost.Lookup(network, netip.AddrPortFrom(server, 53).String(), probeName, probeTimeout)
			return err == nil
		})
		if err != nil || got != probeAddr {
			t.Errorf("DNS over %s from the sandbox: %v, %v; want %v", network, got, err, probeAddr)
		}
	}
}

func TestEgressDefaultDeny(t *testing.T) {
	h := newEgressHosts(t)
	m := newTestManager(t, Config{PoolSize: -1, Resolvers: []netip.Addr{h.private.Addr}})
	s := acquire(t, m)
	udp, err := h.private.ListenUDP(0)
	if err != nil {
		t.Fatal(err)
	}
	testhost.DoInNetNS(t, s.NetNSPath, func() {
		// First, so that the slot's gateway is resolved (see mustBeRefused).
		mustReach(t, "an internet host", h.publicAddr(), "public")
		mustBeRefused(t, "a private host", h.privateAddr())
		mustBeRefused(t, "the cloud metadata address", h.metadataAddr())
		// DNS to the configured resolver works over UDP and TCP, while
		// its other ports stay refused, and so does port 53 elsewhere.
		mustResolve(t, h.private.Addr)
		mustBeRefused(t, "port 53 of a private host that is not a resolver", netip.AddrPortFrom(h.metadata.Addr, 53))
		// UDP elsewhere is refused with an ICMP error the sender sees.
		c, err := net.DialUDP("udp4", nil, udp.LocalAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(probeTimeout))
		if _, err := c.Read(make([]byte, 16)); !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("UDP to a private host: %v; want host unreachable (administratively prohibited)", err)
		}
	})
	_ = udp.SetReadDeadline(time.Now().Add(probeTimeout))
	if n, _, err := udp.ReadFrom(make([]byte, 16)); err == nil {
		t.Errorf("a datagram (%d bytes) from the sandbox reached the private host", n)
	}
	if udpQ, tcpQ := h.dns.Queries(); udpQ == 0 || tcpQ == 0 {
		t.Errorf("the DNS server saw %d UDP and %d TCP queries", udpQ, tcpQ)
	}
}

func TestEgressAllowPrivate(t *testing.T) {
	h := newEgressHosts(t)
	t.Run("one range", func(t *testing.T) {
		m := newTestManager(t, Config{PoolSize: -1, AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.201.0.0/24")}})
		s := acquire(t, m)
		testhost.DoInNetNS(t, s.NetNSPath, func() {
			mustReach(t, "an allowed private host", h.privateAddr(), "private")
			mustBeRefused(t, "the cloud metadata address", h.metadataAddr())
			mustReach(t, "an internet host", h.publicAddr(), "public")
		})
	})
	// Allowing ranges that hold the host's addresses and the slots' range
	// opens neither the host nor other sandboxes, not even through a port
	// forward (DNAT) on the host.
	t.Run("ranges holding the host and the slots", func(t *testing.T) {
		m := newTestManager(t, Config{PoolSize: -1, AllowPrivate: []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("127.0.0.0/8"),
		}})
		a, b := acquire(t, m), acquire(t, m)
		var portB int
		testhost.DoInNetNS(t, b.NetNSPath, func() { portB = listen(t, "0.0.0.0:0").Port })
		hostPort := listen(t, "0.0.0.0:0").Port
		forwarded := 40000 + a.ID
		portForward(t, a.HostIP, forwarded, h.privateAddr())
		testhost.DoInNetNS(t, a.NetNSPath, func() {
			mustReach(t, "an allowed private host", h.privateAddr(), "private")
			mustReach(t, "the allowed metadata address", h.metadataAddr(), "metadata")
			for what, addr := range map[string]netip.AddrPort{
				"another sandbox":                         netip.AddrPortFrom(b.SandboxIP, uint16(portB)),
				"a host service on its gateway":           netip.AddrPortFrom(a.HostIP, uint16(hostPort)),
				"a host service on a test host's gateway": netip.AddrPortFrom(h.private.Gateway, uint16(hostPort)),
				"a port forward on the host":              netip.AddrPortFrom(a.HostIP, uint16(forwarded)),
			} {
				if saw, err := dial(addr.String(), netip.Addr{}); err == nil {
					t.Errorf("sandbox reached %s at %s (it answered %q)", what, addr, saw)
				}
			}
		})
		// The forward itself works, for anyone but a sandbox.
		h.public.Do(t, func() {
			if saw, err := dialReachable(netip.AddrPortFrom(a.HostIP, uint16(forwarded)).String(), netip.Addr{}); err != nil || saw != "private" {
				t.Errorf("port forward from a test host: %q, %v", saw, err)
			}
		})
	})
}

// A changed policy applies to running sandboxes at once, to connections
// they already have too: New replaces the tables in one batch.
func TestEgressPolicyChange(t *testing.T) {
	h := newEgressHosts(t)
	echo, err := h.private.ListenTCP(0) // closed with the host
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := echo.Accept()
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
	echoAddr := echo.Addr().String()

	allowed := []netip.Prefix{netip.MustParsePrefix("10.201.0.0/24")}
	m := newTestManager(t, Config{PoolSize: -1, AllowPrivate: allowed})
	s := acquire(t, m)
	var conn net.Conn
	testhost.DoInNetNS(t, s.NetNSPath, func() {
		var err error
		if conn, err = net.DialTimeout("tcp4", echoAddr, reachTimeout); err != nil {
			t.Fatal(err)
		}
	})
	defer conn.Close()
	rd := bufio.NewReader(conn)
	roundTrip := func(msg string) error {
		_ = conn.SetDeadline(time.Now().Add(reachTimeout))
		if _, err := fmt.Fprintln(conn, msg); err != nil {
			return err
		}
		line, err := rd.ReadString('\n')
		if err == nil && line != msg+"\n" {
			err = fmt.Errorf("echoed %q", line)
		}
		return err
	}
	if err := roundTrip("one"); err != nil {
		t.Fatalf("allowed: %v", err)
	}

	m.cfg.AllowPrivate = nil // as a restart without --allow-private-cidr
	if err := m.installRules(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip("two"); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("an open connection after its range was closed: %v; want it reset", err)
	}
	testhost.DoInNetNS(t, s.NetNSPath, func() { mustBeRefused(t, "the private host after the change", h.privateAddr()) })

	m.cfg.AllowPrivate = allowed
	if err := m.installRules(); err != nil {
		t.Fatal(err)
	}
	testhost.DoInNetNS(t, s.NetNSPath, func() { mustReach(t, "the private host allowed again", h.privateAddr(), "private") })
}

// portForward adds, in a table of the test's own, what a container engine
// does to publish a port: connections to host:port are DNATed to target.
func portForward(t *testing.T, host netip.Addr, port int, target netip.AddrPort) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Name: testPrefix + "_dnat", Family: nftables.TableFamilyIPv4}
	c.DelTable(table)
	_ = c.Flush() // a leftover of an interrupted run; no error if there is none
	c.AddTable(table)
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "prerouting", Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: host.AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
		&expr.Immediate{Register: 1, Data: target.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(target.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2},
	}})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.DelTable(table)
		if err := c.Flush(); err != nil {
			t.Error(err)
		}
	})
}
