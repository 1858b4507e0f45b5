// Package testhost makes stand-in hosts for network tests: each is a
// network namespace of its own, joined to the root namespace by a veth
// pair, that holds one chosen address. Traffic to that address, from the
// host or from a sandbox, is routed into the namespace and nowhere else, so
// a test can probe private, link-local or "internet" addresses without a
// packet leaving the machine. Open checks the route before it returns.
//
// Test binaries of several packages run at once under `go test ./...`, and
// some want the same address (169.254.169.254 above all). A host holds an
// exclusive lock on its address and one on its name until it is closed, so
// a second user of either waits for the first instead of taking its route
// or removing its namespace.
//
// Only for tests: it needs root and iproute2's `ip`.
package testhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
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
	// Waited is how long Open waited for another test host with the same
	// name or address to close.
	Waited time.Duration

	unlock   func() // gives back the name and address locks
	accepted atomic.Int64

	mu      sync.Mutex
	closers []io.Closer // the sockets opened in the namespace
	closed  bool
}

// validName is what Open accepts as a name: an interface name (at most 15
// characters) that is also safe in a file name.
var validName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,14}$`)

// Open creates the test host name with address addr (e.g. 10.201.0.2/24);
// the host end of its veth takes the first other usable address of that
// subnet. Name must be a name no other package's tests give a test host:
// a leftover of that name (an interrupted run) is removed first. While
// another live test host has the same name or address, Open waits for it,
// at most LockWait. Close removes the host.
func Open(name string, addr netip.Prefix) (*Host, error) {
	return open(name, addr, LockWait)
}

// New is Open for a test: it skips the test when not root, fails it when
// the host cannot be made (or the wait for the address outlasts the
// test's deadline), and closes the host at the end of the test.
func New(t testing.TB, name string, addr netip.Prefix) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("test hosts need root")
	}
	h, err := open(name, addr, lockWaitFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if h.Waited > time.Second {
		t.Logf("testhost %s: waited %s for another test host at %s or named so", name, h.Waited.Round(time.Second), h.Addr)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("testhost: %v", err)
		}
	})
	return h
}

func open(name string, addr netip.Prefix, wait time.Duration) (*Host, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("testhost: test hosts need root")
	}
	if !validName.MatchString(name) {
		return nil, fmt.Errorf("testhost: %q is not a usable name (1-15 letters, digits, - or _)", name)
	}
	if !addr.Addr().Is4() || addr.Bits() > 30 {
		return nil, fmt.Errorf("testhost %s: %s: need an IPv4 address in a subnet of /30 or larger", name, addr)
	}
	start := time.Now()
	unlock, err := lock(name, addr.Addr(), wait)
	if err != nil {
		return nil, err
	}
	h := &Host{Name: name, NetNSPath: "/var/run/netns/" + name, Addr: addr.Addr(), Gateway: gatewayFor(addr),
		Waited: time.Since(start), unlock: unlock}
	// Holding the name's lock, a namespace or link of that name is a dead
	// run's leftover, never another live test's host.
	if err := h.remove(); err != nil {
		unlock()
		return nil, fmt.Errorf("testhost %s: removing a leftover: %w", name, err)
	}
	if err := h.create(addr.Bits()); err != nil {
		return nil, errors.Join(err, h.Close())
	}
	return h, nil
}

// create makes the namespace and the veth pair and checks that the host
// routes Addr into the namespace.
func (h *Host) create(bits int) error {
	b := fmt.Sprint(bits)
	for _, args := range [][]string{
		{"netns", "add", h.Name},
		{"link", "add", h.Name, "type", "veth", "peer", "name", "eth0", "netns", h.Name},
		{"addr", "add", h.Gateway.String() + "/" + b, "dev", h.Name},
		{"link", "set", h.Name, "up"},
		{"-n", h.Name, "link", "set", "lo", "up"},
		{"-n", h.Name, "addr", "add", h.Addr.String() + "/" + b, "dev", "eth0"},
		{"-n", h.Name, "link", "set", "eth0", "up"},
		{"-n", h.Name, "route", "add", "default", "via", h.Gateway.String()},
	} {
		if err := ip(args...); err != nil {
			return fmt.Errorf("testhost %s: %w", h.Name, err)
		}
	}
	if dev, err := RouteDev(h.Addr); err != nil || dev != h.Name {
		return fmt.Errorf("testhost %s: %s is routed to %q (%v), not into the test namespace: refusing to probe it", h.Name, h.Addr, dev, err)
	}
	return nil
}

// Close closes the sockets opened in the test host, removes it and gives
// back its locks. A second Close does nothing.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	closers := h.closers
	h.closers = nil
	h.mu.Unlock()
	for _, c := range closers {
		c.Close()
	}
	err := h.remove()
	if err != nil {
		err = fmt.Errorf("removing test host %s: %w", h.Name, err)
	}
	// Kept on failure: a host half-removed must not be handed to the next
	// user of its address. The locks go when the process ends.
	if err == nil {
		h.unlock()
	}
	return err
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

// remove deletes the namespace and the veth pair, if they exist. A link of
// the name that is no veth is never a test host's: it is left alone.
func (h *Host) remove() error {
	var errs []error
	if l, err := netlink.LinkByName(h.Name); err == nil {
		if l.Type() != "veth" {
			return fmt.Errorf("the interface %s is a %s, not a test host's veth: choose another name", h.Name, l.Type())
		}
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

// track records a socket for Close, or closes it at once when the host is
// closed already.
func (h *Host) track(c io.Closer) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		c.Close()
		return fmt.Errorf("testhost %s is closed", h.Name)
	}
	h.closers = append(h.closers, c)
	return nil
}

// nsTimeout bounds code run inside a test host's namespace.
const nsTimeout = 30 * time.Second

// Run runs f inside the test host's namespace (see RunInNetNS).
func (h *Host) Run(f func() error) error {
	return RunInNetNS(h.NetNSPath, f)
}

// Do is Run for a test: f may call t.Fatal, and a failure fails the test.
func (h *Host) Do(t testing.TB, f func()) {
	t.Helper()
	DoInNetNS(t, h.NetNSPath, f)
}

// RunInNetNS runs f inside the network namespace pinned at path (a test
// host's or any other), on an OS thread of its own that is thrown away
// afterwards, and returns f's error. Sockets f opens stay in that
// namespace whichever goroutine uses them later.
func RunInNetNS(path string, f func() error) error {
	done := make(chan error, 1)
	go func() {
		// Stays if f never returns (it called t.Fatal, which ends the goroutine).
		result := fmt.Errorf("failed inside the network namespace %s", path)
		defer func() { done <- result }()
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ns, err := netns.GetFromPath(path)
		if err != nil {
			result = err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			result = err
			return
		}
		result = f()
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(nsTimeout):
		return fmt.Errorf("code inside the network namespace %s did not finish in %s", path, nsTimeout)
	}
}

// DoInNetNS is RunInNetNS for a test: f may call t.Fatal, and a failure
// fails the test.
func DoInNetNS(t testing.TB, path string, f func()) {
	t.Helper()
	if err := RunInNetNS(path, func() error { f(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// ListenTCP listens on port of the test host (0: any). Close closes the
// listener too.
func (h *Host) ListenTCP(port int) (*net.TCPListener, error) {
	var ln *net.TCPListener
	if err := h.Run(func() (err error) {
		ln, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(h.Addr, uint16(port))))
		return err
	}); err != nil {
		return nil, err
	}
	return ln, h.track(ln)
}

// ListenUDP opens a UDP socket on port of the test host (0: any). Close
// closes it too.
func (h *Host) ListenUDP(port int) (*net.UDPConn, error) {
	var c *net.UDPConn
	if err := h.Run(func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(h.Addr, uint16(port))))
		return err
	}); err != nil {
		return nil, err
	}
	return c, h.track(c)
}

// StartTCP listens on port of the test host (0: any) and answers every
// connection with reply, then hangs up; Accepted counts the connections.
// It returns the port. The server stops at Close.
func (h *Host) StartTCP(port int, reply string) (int, error) {
	ln, err := h.startTCP(port, reply)
	if err != nil {
		return 0, err
	}
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ServeTCP is StartTCP for a test: the server stops at the end of the test.
func (h *Host) ServeTCP(t testing.TB, port int, reply string) int {
	t.Helper()
	ln, err := h.startTCP(port, reply)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func (h *Host) startTCP(port int, reply string) (*net.TCPListener, error) {
	ln, err := h.ListenTCP(port)
	if err != nil {
		return nil, err
	}
	go Answer(ln, reply, &h.accepted)
	return ln, nil
}

// Answer answers every connection ln accepts with reply, then hangs up,
// until ln is closed; it counts the connections in accepted. StartTCP
// serves with it; a test can also use it for a listener of its own, e.g.
// a service of the host that sandboxes must not reach.
func Answer(ln net.Listener, reply string, accepted *atomic.Int64) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		accepted.Add(1)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write([]byte(reply))
		c.Close()
	}
}

// Accepted returns how many connections the host's StartTCP and ServeTCP
// servers have accepted.
func (h *Host) Accepted() int64 { return h.accepted.Load() }

// HTTPReply is a whole HTTP/1.0 response with body, for StartTCP: an HTTP
// client reads it as a 200.
func HTTPReply(body string) string {
	return fmt.Sprintf("HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}
