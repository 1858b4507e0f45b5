package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Slot is one sandbox's network. Its fields are fixed by its ID.
type Slot struct {
	ID        int
	Name      string // network namespace name
	NetNSPath string // /var/run/netns/<Name>: what the OCI spec's network namespace path is set to
	HostVeth  string // host end of the veth pair; eth0 is the end inside
	HostIP    netip.Addr
	SandboxIP netip.Addr
	PrefixLen int
}

// testHook, when set (by tests only), runs after each step of a slot build;
// an error from it fails the build there, to prove that nothing is left.
var testHook func(step string) error

func hook(step string) error {
	if testHook == nil {
		return nil
	}
	return testHook(step)
}

// build makes the slot's namespace and veth pair and configures both ends.
// On error it removes what it made, and only that: a name that turned out
// to be taken belongs to somebody else.
func (m *Manager) build(s *Slot) (err error) {
	ns, inside, err := newNamedNetns(s.NetNSPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	defer inside.Close()
	vethMade := false
	defer func() {
		if err == nil {
			return
		}
		if vethMade {
			// The pair would also go with the namespace, but only
			// asynchronously; the name must be free when we return.
			if link, lerr := m.nl.LinkByName(s.HostVeth); lerr == nil {
				_ = m.nl.LinkDel(link)
			}
		}
		_ = deleteNamedNetns(s.NetNSPath)
	}()
	if err := hook("netns"); err != nil {
		return err
	}

	// Created up, with its peer created straight inside the namespace:
	// fewer round trips than adding, moving and raising separately.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostVeth, Flags: net.FlagUp},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := m.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding veth %s: %w", s.HostVeth, err)
	}
	vethMade = true
	if err := hook("veth"); err != nil {
		return err
	}
	if err := m.nl.AddrAdd(veth, ipNet(s.HostIP, s.PrefixLen)); err != nil {
		return fmt.Errorf("addressing %s: %w", s.HostVeth, err)
	}
	if err := hook("host address"); err != nil {
		return err
	}
	if err := configureInside(inside, s); err != nil {
		return err
	}
	return hook("inside")
}

// configureInside brings lo and eth0 up and gives eth0 the sandbox address
// and the default route. Replace semantics make it idempotent, which
// RestoreAddress relies on.
func configureInside(h *netlink.Handle, s *Slot) error {
	// lo is always ifindex 1 in a namespace; naming the index saves a lookup.
	lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", Index: 1}}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("raising lo: %w", err)
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("finding eth0: %w", err)
	}
	if err := h.AddrReplace(eth0, ipNet(s.SandboxIP, s.PrefixLen)); err != nil {
		return fmt.Errorf("addressing eth0: %w", err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("raising eth0: %w", err)
	}
	def := &netlink.Route{
		LinkIndex: eth0.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw:        s.HostIP.AsSlice(),
	}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("default route via %s: %w", s.HostIP, err)
	}
	return nil
}

// RestoreAddress puts eth0's address and the default route back and makes
// sure lo and eth0 are up. gVisor (runsc --network=sandbox) moves the
// address into its own network stack, so it has to be re-added before
// `runsc restore` into this slot. Calling it on an intact slot changes
// nothing.
func (s *Slot) RestoreAddress() error {
	ns, err := netns.GetFromPath(s.NetNSPath)
	if err != nil {
		return fmt.Errorf("network: opening %s: %w", s.NetNSPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("network: netlink in %s: %w", s.Name, err)
	}
	defer h.Close()
	if err := configureInside(h, s); err != nil {
		return fmt.Errorf("network: restoring %s: %w", s.Name, err)
	}
	return nil
}

// teardown removes whatever exists of a slot: the veth pair and the pinned
// namespace. The caller marks the id dirty: conntrack may still hold flows
// of the sandbox address (see flushDirty).
func (m *Manager) teardown(s *Slot) error {
	var errs []error
	if link, err := m.nl.LinkByName(s.HostVeth); err == nil {
		// Deleting one end deletes the pair, synchronously, so the name
		// and the /30's route are gone when we return, and a process that
		// escaped the runtime's kill has no network left.
		if err := m.nl.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", s.HostVeth, err))
		}
	} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
		errs = append(errs, fmt.Errorf("looking up %s: %w", s.HostVeth, err))
	}
	if err := deleteNamedNetns(s.NetNSPath); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func ipNet(ip netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
}
