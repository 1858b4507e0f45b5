package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/warren-sandbox/warren/internal/poll"
)

// Tests use their own prefix and range, so they never touch the slots or
// tables of a Warren running on the same host, nor other packages' tests.
const (
	testPrefix = "wtst"
	testCIDR   = "10.123.0.0/16"
	// probeTimeout bounds every connection attempt that is expected to be
	// dropped; a reachable peer on a veth answers in well under a millisecond.
	probeTimeout = 300 * time.Millisecond
	// refusedTimeout bounds a connection attempt that must be refused.
	// Only a reset makes one fail with ECONNREFUSED (a dropped SYN ends in
	// a timeout however long the wait), so a generous bound proves the
	// same thing and does not fail when the first packet waits for ARP on
	// a loaded machine.
	refusedTimeout = 3 * time.Second
)

func needRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("network slots need root")
	}
	if testing.Short() {
		tb.Skip("makes network slots and test hosts: not in -short (make check)")
	}
}

// newTestManager starts a manager with the test prefix (and the test range
// unless cfg has one). At the end of the test it is closed and the host is
// checked for anything of ours left behind.
func newTestManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	needRoot(t)
	cfg.Prefix = testPrefix
	if !cfg.CIDR.IsValid() {
		cfg.CIDR = netip.MustParsePrefix(testCIDR)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if left := leftovers(t, testPrefix); len(left) > 0 {
			t.Errorf("left behind after Close: %v", left)
			_ = m.Cleanup(nil) // don't fail the next test too
			_ = m.Destroy()
		}
	})
	return m
}

// leftovers lists what exists on the host with the prefix: pinned
// namespace files, mounts on them, veths and nftables tables.
func leftovers(t testing.TB, prefix string) []string {
	t.Helper()
	var out []string
	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			out = append(out, "netns "+e.Name())
		}
	}
	// mountinfo shows resolved paths: /run/netns where /var/run -> /run.
	dir, err := filepath.EvalSymlinks(netnsDir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for sc := bufio.NewScanner(f); sc.Scan(); {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/"+prefix+"-") {
			out = append(out, "mount "+fields[4])
		}
	}
	links, err := whole(netlink.LinkList)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix+"v") {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == "warren_"+prefix || tb.Name == "warren_"+prefix+"_nat" {
			out = append(out, "nftables table "+tb.Name)
		}
	}
	return out
}

func acquire(t testing.TB, m *Manager) *Slot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := m.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Released even when the test stops early; a second Release is harmless.
	t.Cleanup(func() { m.Release(s) })
	return s
}

// listen starts a server on addr (in the calling thread's namespace) that
// writes the address it sees the client at and hangs up.
func listen(t testing.TB, addr string) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
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
			fmt.Fprintln(c, c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr)
}

// dial connects to addr from the calling thread's namespace, optionally
// from a given source address, and returns what the server wrote: the
// client address it saw.
func dial(addr string, from netip.Addr) (string, error) {
	return dialWithin(addr, from, probeTimeout)
}

// dialWithin is dial with its own bound on the connection attempt.
func dialWithin(addr string, from netip.Addr, timeout time.Duration) (string, error) {
	d := net.Dialer{Timeout: timeout}
	if from.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
	}
	c, err := d.Dial("tcp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(probeTimeout))
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// reachTimeout bounds connection attempts that are expected to succeed.
// The first packet to a fresh address waits for ARP, and a neighbour entry
// left unresolved by an earlier probe of the same address is retried only
// once a second, so these retry for a few seconds instead of failing.
const reachTimeout = 4 * time.Second

// dialReachable is dial for a peer that must answer: it retries until
// reachTimeout.
func dialReachable(addr string, from netip.Addr) (string, error) {
	var saw string
	var err error
	poll.Within(reachTimeout, 20*time.Millisecond, func() bool { saw, err = dial(addr, from); return err == nil })
	return saw, err
}

func hostPort(ip netip.Addr, port int) string {
	return netip.AddrPortFrom(ip, uint16(port)).String()
}
