// Package testhost makes stand-in hosts for network tests: each is a
// network namespace of its own, joined to the root namespace by a veth
// pair, that holds one chosen address. Traffic to that address, from the
// host or from a sandbox, is routed into the namespace and nowhere else, so
// a test can probe private, link-local or "internet" addresses without a
// packet leaving the machine. New checks the route before it returns.
//
// Only for tests: it needs root and iproute2's `ip`.
package testhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// Host is a test host.
type Host struct {
	// Name names both the namespace (pinned at /var/run/netns/<Name>) and
	// the host end of the veth pair; the end inside is eth0.
	Name      string
	NetNSPath string
	// Addr is the test host's address, on its eth0.
	Addr netip.Addr
	// Gateway is the host end's address, the test host's default route:
	// the test host answers any address, including sandboxes' own.
	Gateway netip.Addr
}

// New creates the test host name with address addr (e.g. 10.201.0.2/24);
// the host end of its veth takes the first other usable address of that
// subnet. Name must be a valid interface name that nothing else on the
// machine uses: a leftover of that name (an interrupted run) is removed
// first. The host is removed at the end of the test.
func New(t testing.TB, name string, addr netip.Prefix) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("test hosts need root")
	}
	if !addr.Addr().Is4() || addr.Bits() > 30 {
		t.Fatalf("testhost: %s: need an IPv4 address in a subnet of /30 or larger", addr)
	}
	h := &Host{Name: name, NetNSPath: "/var/run/netns/" + name, Addr: addr.Addr(), Gateway: gatewayFor(addr)}
	h.remove()
	t.Cleanup(func() {
		if err := h.remove(); err != nil {
			t.Errorf("testhost: removing %s: %v", name, err)
		}
	})
	bits := fmt.Sprint(addr.Bits())
	for _, args := range [][]string{
		{"netns", "add", name},
		{"link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name},
		{"addr", "add", h.Gateway.String() + "/" + bits, "dev", name},
		{"link", "set", name, "up"},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "addr", "add", h.Addr.String() + "/" + bits, "dev", "eth0"},
		{"-n", name, "link", "set", "eth0", "up"},
		{"-n", name, "route", "add", "default", "via", h.Gateway.String()},
	} {
		if err := ip(args...); err != nil {
			t.Fatalf("testhost %s: %v", name, err)
		}
	}
	if dev, err := RouteDev(h.Addr); err != nil || dev != name {
		t.Fatalf("testhost %s: %s is routed to %q (%v), not into the test namespace: refusing to probe it", name, h.Addr, dev, err)
	}
	return h
}

// gatewayFor returns the first usable address of addr's subnet that is not
// addr itself.
func gatewayFor(addr netip.Prefix) netip.Addr {
	gw := addr.Masked().Addr().Next()
	if gw == addr.Addr() {
		gw = gw.Next()
	}
	return gw
}

// RouteDev returns the interface that `ip route get` says the host sends
// packets for addr out of.
func RouteDev(addr netip.Addr) (string, error) {
	out, err := exec.Command("ip", "-j", "route", "get", addr.String()).Output()
	if err != nil {
		return "", fmt.Errorf("ip route get %s: %w", addr, err)
	}
	var routes []struct {
		Dev string `json:"dev"`
	}
	if err := json.Unmarshal(out, &routes); err != nil || len(routes) == 0 {
		return "", fmt.Errorf("ip route get %s: unexpected output %q", addr, out)
	}
	return routes[0].Dev, nil
}

// remove deletes the namespace and the veth pair, if they exist.
func (h *Host) remove() error {
	var errs []error
	if _, err := net.InterfaceByName(h.Name); err == nil {
		errs = append(errs, ip("link", "del", h.Name))
	}
	if _, err := os.Stat(h.NetNSPath); err == nil {
		errs = append(errs, ip("netns", "del", h.Name))
	}
	return errors.Join(errs...)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Do runs f inside the test host's namespace, on an OS thread of its own
// that is thrown away afterwards. Sockets f opens stay in the namespace
// whichever goroutine uses them later.
func (h *Host) Do(t testing.TB, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		result := errors.New("failed inside the test namespace") // stays if f calls t.Fatal
		defer func() { done <- result }()
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ns, err := netns.GetFromPath(h.NetNSPath)
		if err != nil {
			result = err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			result = err
			return
		}
		f()
		result = nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("testhost: code inside the namespace did not finish")
	}
}

// ServeTCP listens on port of the test host (0: any) and answers every
// connection with reply, then hangs up. It returns the port.
func (h *Host) ServeTCP(t testing.TB, port int, reply string) int {
	t.Helper()
	var ln net.Listener
	h.Do(t, func() {
		var err error
		if ln, err = net.Listen("tcp4", netip.AddrPortFrom(h.Addr, uint16(port)).String()); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write([]byte(reply))
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// ListenUDP opens a UDP socket on port of the test host (0: any).
func (h *Host) ListenUDP(t testing.TB, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	h.Do(t, func() {
		var err error
		if c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(h.Addr, uint16(port)))); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { c.Close() })
	return c
}
