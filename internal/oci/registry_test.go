package oci

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// A registry on loopback is refused unless it is allowed, whichever way
// it is named: its address is checked when it is dialled, after the name
// was resolved.
func TestPullRefusesLoopbackRegistry(t *testing.T) {
	s := tempStore(t)
	reg, _ := startRegistry(t, nil)
	l := mkTar(t, tfile("f", "f", 0o644))
	push(t, reg.host+"/test/img:1", testImage(t, "amd64", v1.Config{}, l))
	_, port, _ := net.SplitHostPort(reg.host)
	ctx := context.Background()
	for _, host := range []string{reg.host, "localhost:" + port, "0.0.0.0:" + port, "[::ffff:127.0.0.1]:" + port} {
		_, err := Pull(ctx, s, host+"/test/img:1", PullOptions{})
		t.Log(err)
		if !errors.Is(err, ErrRegistryNotAllowed) || !strings.Contains(err.Error(), "--allow-insecure-registry") {
			t.Errorf("%s: err = %v, want a refusal that says what to do", host, err)
		}
	}
	// Allowed by host and port, or by host alone.
	for _, allow := range []string{reg.host, "127.0.0.1"} {
		tmpl, err := Pull(ctx, s, reg.host+"/test/img:1", PullOptions{AllowInsecure: []string{allow}})
		if err != nil {
			t.Fatalf("allowed %s: %v", allow, err)
		}
		if !slices.Equal(tmpl.Layers, []string{"oci-" + diffIDOf(l).Hex}) {
			t.Errorf("layers %v", tmpl.Layers)
		}
	}
	// Allowing one port does not allow another.
	if _, err := Pull(ctx, s, reg.host+"/test/img:1", PullOptions{AllowInsecure: []string{"127.0.0.1:1"}}); !errors.Is(err, ErrRegistryNotAllowed) {
		t.Errorf("another port allowed: err = %v, want a refusal", err)
	}
	// The mirror is allowed.
	push(t, reg.host+"/library/mirrored:1", testImage(t, "amd64", v1.Config{}, l))
	if _, err := Pull(ctx, s, "mirrored:1", PullOptions{Mirror: "http://" + reg.host}); err != nil {
		t.Errorf("through the mirror: %v", err)
	}
}

// A registry at a private address is refused unless allowed. It runs in
// a network namespace of its own behind a veth, so nothing leaves the
// machine whatever the pull does.
func TestPullRefusesPrivateRegistry(t *testing.T) {
	s := tempStore(t)
	host := privateRegistry(t)
	l := mkTar(t, tfile("p", "p", 0o644))
	push(t, host+"/test/img:1", testImage(t, "amd64", v1.Config{}, l))
	ctx := context.Background()
	_, err := Pull(ctx, s, host+"/test/img:1", PullOptions{})
	t.Log(err)
	if !errors.Is(err, ErrRegistryNotAllowed) || !strings.Contains(err.Error(), "private") || !strings.Contains(err.Error(), "--allow-insecure-registry") {
		t.Errorf("err = %v, want a refusal of a private address", err)
	}
	tmpl, err := Pull(ctx, s, host+"/test/img:1", PullOptions{AllowInsecure: []string{host}})
	if err != nil {
		t.Fatalf("allowed: %v", err)
	}
	if !slices.Equal(tmpl.Layers, []string{"oci-" + diffIDOf(l).Hex}) {
		t.Errorf("layers %v", tmpl.Layers)
	}
}

const (
	privVeth = "wimgreg0"
)

var (
	privHostIP = netip.MustParseAddr("172.31.202.1")
	privRegIP  = netip.MustParseAddr("172.31.202.2")
)

// privateRegistry serves a registry at 172.31.202.2 in a new network
// namespace reached through a veth, and returns its host:port.
func privateRegistry(t *testing.T) string {
	t.Helper()
	if l, err := netlink.LinkByName(privVeth); err == nil {
		_ = netlink.LinkDel(l) // from an interrupted run
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // and this thread is in it
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: privVeth}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(privVeth); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: &net.IPNet{IP: privHostIP.AsSlice(), Mask: net.CIDRMask(30, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: privRegIP.AsSlice(), Mask: net.CIDRMask(30, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	// The route to the registry's address goes into the namespace.
	routes, err := netlink.RouteGet(privRegIP.AsSlice())
	if err != nil || len(routes) == 0 {
		t.Fatalf("route to %s: %v", privRegIP, err)
	}
	if routes[0].LinkIndex != veth.Attrs().Index {
		t.Fatalf("the route to %s does not go through %s: %+v", privRegIP, privVeth, routes[0])
	}
	// The listener is made in the namespace and stays there.
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(privRegIP, 5000).String())
	if serr := netns.Set(orig); serr != nil {
		panic(serr) // the thread must not go back to the pool in the namespace
	}
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestRefusedAddress(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1": "loopback", "127.1.2.3": "loopback", "::1": "loopback", "::ffff:127.0.0.1": "loopback",
		"10.1.2.3": "private", "172.16.0.1": "private", "192.168.1.1": "private", "100.64.0.1": "private",
		"fc00::1": "private", "fec0::1": "private", "::ffff:10.0.0.1": "private",
		"169.254.169.254": "link-local", "fe80::1": "link-local",
		"224.0.0.1": "multicast", "ff02::1": "multicast",
		"0.0.0.0": "unspecified", "0.1.2.3": "unspecified", "::": "unspecified",
		"240.0.0.1": "reserved", "255.255.255.255": "reserved", "::10.0.0.1": "reserved",
		"8.8.8.8": "", "198.18.0.1": "", "2a00:1450::1": "",
	} {
		if got := refusedAddress(netip.MustParseAddr(addr)); got != want {
			t.Errorf("%s: %q, want %q", addr, got, want)
		}
	}
}

// Plain HTTP is refused before any connection is made, whatever the
// address.
func TestPlainHTTPRefused(t *testing.T) {
	p, err := newRegistryPolicy([]string{"allowed.test:5000"}, "")
	if err != nil {
		t.Fatal(err)
	}
	tr := p.transport()
	dialled := false
	tr.Transport.DialContext = func(context.Context, string, string) (net.Conn, error) {
		dialled = true
		return nil, errors.New("no connection in this test")
	}
	for _, u := range []string{"http://registry.example.com/v2/", "http://198.18.0.10:5000/v2/", "http://allowed.test:5001/v2/"} {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, ErrRegistryNotAllowed) || !strings.Contains(err.Error(), "plain http") {
			t.Errorf("%s: err = %v, want a refusal of plain HTTP", u, err)
		}
	}
	if dialled {
		t.Error("a refused request made a connection")
	}
	// The allowed one gets as far as dialling.
	req, _ := http.NewRequest(http.MethodGet, "http://allowed.test:5000/v2/", nil)
	if _, err := tr.RoundTrip(req); errors.Is(err, ErrRegistryNotAllowed) || !dialled {
		t.Errorf("allowed registry: err = %v, dialled %v", err, dialled)
	}
}

func TestParseRegistryHost(t *testing.T) {
	for in, want := range map[string][2]string{
		"registry.local": {"registry.local", ""}, "Registry.Local:5000": {"registry.local", "5000"},
		"10.0.0.5:443": {"10.0.0.5", "443"}, "[::1]:5000": {"::1", "5000"}, "[fd00::1]": {"fd00::1", ""}, "fd00::1": {"fd00::1", ""},
	} {
		h, p, err := ParseRegistryHost(in)
		if err != nil || h != want[0] || p != want[1] {
			t.Errorf("%s: %q %q %v, want %q %q", in, h, p, err, want[0], want[1])
		}
	}
	for _, in := range []string{"", "http://x", "x/y", "x:0", "x:70000", "x:y", "user@x", ":5000", "[::1", "fd00::zz"} {
		if _, _, err := ParseRegistryHost(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}
