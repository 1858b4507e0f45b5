package testhost

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// Addresses and names only these tests use.
var (
	testAddr  = netip.MustParsePrefix("198.18.205.2/30")
	otherAddr = netip.MustParsePrefix("198.18.205.6/30")
)

// A second user of an address or a name waits for the first, and gives up
// after its bound saying who holds it; a released lock is free at once.
func TestLockExcludesPerAddressAndName(t *testing.T) {
	lockDir = t.TempDir()
	t.Cleanup(func() { lockDir = "/run/lock" })
	a := testAddr.Addr()
	unlock, err := lock("wthone", a, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what, name string
		addr       netip.Addr
	}{
		{"the same address", "wthtwo", a},
		{"the same name", "wthone", otherAddr.Addr()},
	} {
		start := time.Now()
		_, err := lock(c.name, c.addr, 300*time.Millisecond)
		if err == nil {
			t.Fatalf("%s: a second lock while the first is held", c.what)
		}
		t.Logf("%s: %v", c.what, err)
		if waited := time.Since(start); waited < 300*time.Millisecond {
			t.Errorf("%s: gave up after %s, before its bound", c.what, waited)
		}
		if want := fmt.Sprintf("pid %d", os.Getpid()); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "wthone") {
			t.Errorf("%s: the error does not name the holder (%s): %v", c.what, want, err)
		}
	}
	// Another name and address do not wait.
	unlockOther, err := lock("wthtwo", otherAddr.Addr(), 300*time.Millisecond)
	if err != nil {
		t.Fatalf("an unrelated host waits: %v", err)
	}
	unlockOther()
	// A waiter gets the lock as soon as it is given back.
	got := make(chan error, 1)
	go func() {
		u, err := lock("wthtwo", a, 10*time.Second)
		if err == nil {
			u()
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond)
	unlock()
	if err := <-got; err != nil {
		t.Fatalf("the waiter did not get the released lock: %v", err)
	}
}

func TestOpenRejectsBadNamesAndAddresses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("test hosts need root")
	}
	for _, c := range []struct {
		name string
		addr netip.Prefix
	}{
		{"", testAddr},
		{"../../etc/x", testAddr},
		{"a name", testAddr},
		{"sixteen-chars-xx", testAddr},
		{"lo", testAddr}, // an interface that is not a test host's: left alone
		{"wthbad", netip.MustParsePrefix("198.18.205.2/31")},
		{"wthbad", netip.MustParsePrefix("fd00::2/64")},
	} {
		if h, err := Open(c.name, c.addr); err == nil {
			h.Close()
			t.Errorf("Open(%q, %s) succeeded", c.name, c.addr)
		}
	}
	if _, err := net.InterfaceByName("lo"); err != nil {
		t.Errorf("lo is gone: %v", err)
	}
}

// Without a testing.TB (as in a TestMain): Open, serve TCP and DNS, reach
// both from the host, Close; then nothing is left and the address is free.
func TestOpenServeClose(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("test hosts need root")
	}
	h, err := Open("wthost", testAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close() // a no-op after the Close below
	port, err := h.StartTCP(0, HTTPReply("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.StartDNS(map[string]netip.Addr{"probe.testhost.test": netip.MustParseAddr("198.18.0.99")}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, netip.AddrPortFrom(h.Addr, uint16(port)).String()); !strings.HasSuffix(got, "\r\n\r\nhello") {
		t.Errorf("from the host: %q", got)
	}
	if n := h.Accepted(); n != 1 {
		t.Errorf("Accepted = %d, want 1", n)
	}
	for _, network := range []string{"udp", "tcp"} {
		got, err := Lookup(network, netip.AddrPortFrom(h.Addr, 53).String(), "probe.testhost.test", 5*time.Second)
		if err != nil || got != netip.MustParseAddr("198.18.0.99") {
			t.Errorf("DNS over %s: %s, %v", network, got, err)
		}
		if _, err := Lookup(network, netip.AddrPortFrom(h.Addr, 53).String(), "other.test", 5*time.Second); err == nil || !strings.Contains(err.Error(), "RCodeNameError") {
			t.Errorf("an unknown name over %s: %v, want NXDOMAIN", network, err)
		}
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName("wthost"); err == nil {
		t.Error("the veth is left after Close")
	}
	if _, err := os.Stat(h.NetNSPath); err == nil {
		t.Error("the namespace is left after Close")
	}
	if dev, _ := RouteDev(h.Addr); dev == "wthost" {
		t.Error("the address still routes to the closed host")
	}
	// The address is free again: a new host takes it without waiting.
	again, err := open("wthost2", testAddr, time.Second)
	if err != nil {
		t.Fatalf("the address stays locked after Close: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}

// A second host at the same address, under another name, waits until the
// first is closed instead of taking its route.
func TestSameAddressWaitsForClose(t *testing.T) {
	first := New(t, "wthfirst", testAddr)
	first.ServeTCP(t, 80, "first")
	opened := make(chan *Host, 1)
	errc := make(chan error, 1)
	go func() {
		h, err := open("wthsecond", testAddr, time.Minute)
		if err != nil {
			errc <- err
			return
		}
		opened <- h
	}()
	// However the test ends, the second host is closed once it opens.
	t.Cleanup(func() {
		first.Close()
		select {
		case h := <-opened:
			h.Close()
		case <-errc:
		}
	})
	select {
	case h := <-opened:
		opened <- h
		t.Fatal("a second host took the address of a live one")
	case err := <-errc:
		errc <- err
		t.Fatal(err)
	case <-time.After(time.Second):
	}
	if got := get(t, first.Addr.String()+":80"); got != "first" {
		t.Errorf("while the second waits, the first answers %q", got)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-opened:
		opened <- h // for the cleanup to close
		if h.Waited < time.Second {
			t.Errorf("the second host says it waited %s, less than the first was held", h.Waited)
		}
		if dev, err := RouteDev(h.Addr); err != nil || dev != "wthsecond" {
			t.Errorf("after the first closed, the address routes to %q (%v)", dev, err)
		}
	case err := <-errc:
		errc <- err
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("the second host did not get the address after the first closed")
	}
}

func get(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
