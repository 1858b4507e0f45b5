package network

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns` pins namespaces; tools and runtimes look there.
const netnsDir = "/var/run/netns"

// prepareNetnsDir makes netnsDir a shared mount point, as iproute2 does.
// Mount namespaces created later (containers) receive copies of the pins;
// with a shared mount, unpinning propagates to those copies and the
// namespace is really freed, instead of lingering as long as they live.
func prepareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err = unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("network: making %s a shared mount: %w", netnsDir, err)
	}
	return nil
}

// newNamedNetns creates a network namespace pinned at path (which must not
// exist) and returns a handle on it and a netlink handle bound to it.
//
// The work runs on a throwaway OS thread: unshare moves only that thread
// into the new namespace, the netlink socket opened there stays bound to
// the namespace, and the thread is never returned to the Go scheduler, so
// no other goroutine can run in the wrong namespace.
func newNamedNetns(path string) (netns.NsHandle, *netlink.Handle, error) {
	// O_EXCL: a namespace of that name that we did not make is not ours.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return netns.None(), nil, err
	}
	f.Close()
	type result struct {
		ns  netns.NsHandle
		h   *netlink.Handle
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine.
		runtime.LockOSThread()
		ns, h, err := unshareAndPin(path)
		done <- result{ns, h, err}
	}()
	r := <-done
	if r.err != nil {
		_ = deleteNamedNetns(path)
	}
	return r.ns, r.h, r.err
}

// unshareAndPin runs on a locked thread that it leaves in the new namespace.
func unshareAndPin(path string) (netns.NsHandle, *netlink.Handle, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return netns.None(), nil, fmt.Errorf("unshare: %w", err)
	}
	// Interfaces created in this namespace from now on, eth0 included,
	// get no IPv6: slots are IPv4-only, and a link-local address would
	// be a way to the host that does not look like the slot's /30.
	// /proc/sys/net shows the namespace of the thread that opens it.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return netns.None(), nil, fmt.Errorf("disabling IPv6: %w", err)
	}
	self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
		return netns.None(), nil, fmt.Errorf("pinning namespace at %s: %w", path, err)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return netns.None(), nil, err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return netns.None(), nil, fmt.Errorf("netlink: %w", err)
	}
	return ns, h, nil
}

// deleteNamedNetns unpins a namespace and removes its file; either may be
// missing already. The namespace itself goes when its last user does.
func deleteNamedNetns(path string) error {
	// EINVAL: the file exists but nothing is mounted on it (a build that
	// failed before pinning, or a crash at that moment).
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpinning %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
