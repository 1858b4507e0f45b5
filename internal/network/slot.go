package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// create builds a new slot; on failure nothing of it is left. A namespace
// that already exists under a slot's name (left by a crashed run that
// Cleanup has not removed yet) is not ours to remove: its subnet stays
// reserved and the next one is tried.
func (m *Manager) create() (*Slot, error) {
	for attempt := 0; ; attempt++ {
		id, err := m.allocate()
		if err != nil {
			return nil, err
		}
		s := m.slot(id)
		err = build(s)
		if err == nil {
			m.mu.Lock()
			m.used[id] = s
			m.mu.Unlock()
			return s, nil
		}
		if errors.Is(err, os.ErrExist) && attempt < 8 {
			continue
		}
		_ = m.teardown(s)
		m.mu.Lock()
		delete(m.used, id)
		m.mu.Unlock()
		return nil, fmt.Errorf("network: building slot %s: %w", s.Name, err)
	}
}

func build(s *Slot) error {
	ns, err := newNamedNetns(s.NetNSPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostVeth},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding veth %s: %w", s.HostVeth, err)
	}
	host, err := netlink.LinkByName(s.HostVeth)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(host, addr(s.HostIP.AsSlice(), s.PrefixLen)); err != nil {
		return fmt.Errorf("addressing %s: %w", s.HostVeth, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	return configureEth0(h, s)
}

// configureEth0 gives eth0 the sandbox address and default route; existing
// ones are kept, so it doubles as RestoreAddress.
func configureEth0(h *netlink.Handle, s *Slot) error {
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(eth0, addr(s.SandboxIP.AsSlice(), s.PrefixLen)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("addressing eth0: %w", err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return err
	}
	route := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: s.HostIP.AsSlice()}
	if err := h.RouteAdd(route); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// RestoreAddress puts eth0's address and default route back. gVisor moves
// them into its own network stack, so before `runsc restore` into this
// slot they must be re-added. Idempotent.
func (s *Slot) RestoreAddress() error {
	ns, err := netns.GetFromPath(s.NetNSPath)
	if err != nil {
		return fmt.Errorf("network: opening %s: %w", s.NetNSPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return configureEth0(h, s)
}

func addr(ip net.IP, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, 32)}}
}

// teardown removes a slot's veth pair and namespace, whatever exists of them.
func (m *Manager) teardown(s *Slot) error {
	var errs []error
	if link, err := netlink.LinkByName(s.HostVeth); err == nil {
		// Deleting one end deletes the pair.
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", s.HostVeth, err))
		}
	}
	errs = append(errs, deleteNamedNetns(s.NetNSPath))
	return errors.Join(errs...)
}

// newNamedNetns creates a network namespace and pins it at path. The
// unshare happens on a throwaway OS thread: that thread ends up in the new
// namespace and is discarded, so no goroutine ever runs in the wrong one.
func newNamedNetns(path string) (netns.NsHandle, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return netns.None(), err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return netns.None(), err
	}
	f.Close()
	type result struct {
		ns  netns.NsHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the runtime ends this thread when the goroutine exits.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{netns.None(), fmt.Errorf("unshare: %w", err)}
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			done <- result{netns.None(), fmt.Errorf("pinning namespace at %s: %w", path, err)}
			return
		}
		ns, err := netns.GetFromPath(path)
		done <- result{ns, err}
	}()
	r := <-done
	if r.err != nil {
		_ = deleteNamedNetns(path)
	}
	return r.ns, r.err
}

// deleteNamedNetns unpins and removes a namespace file; a missing one is fine.
func deleteNamedNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
