package network

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The range's unreachable route. Each slot's /30 is routed through its
// veth (the kernel adds that route with the host end's address); the
// rest of the range, including every released /30, matches this route
// instead of the default one. Without it, a packet the host still sends
// to a gone sandbox (the ACK of a connection the proxy held open, a
// retransmission) would leave through the uplink towards a private
// address outside the machine, and would make a conntrack flow that the
// next holder of the address inherits. With it the sender gets
// EHOSTUNREACH at once.

const rangeRouteMetric = 4_000_000

func (m *Manager) rangeRoute() *netlink.Route {
	return &netlink.Route{
		Dst:   &net.IPNet{IP: m.cfg.CIDR.Addr().AsSlice(), Mask: net.CIDRMask(m.cfg.CIDR.Bits(), 32)},
		Type:  unix.RTN_UNREACHABLE,
		Table: unix.RT_TABLE_MAIN,
		// A metric the kernel's own routes never have: where a slot's
		// /30 is the whole range, its route (metric 0) still wins.
		Priority: rangeRouteMetric,
	}
}

// installRangeRoute adds (or keeps) the range's unreachable route.
func (m *Manager) installRangeRoute() error {
	if err := m.nl.RouteReplace(m.rangeRoute()); err != nil {
		return fmt.Errorf("network: unreachable route for %s: %w", m.cfg.CIDR, err)
	}
	return nil
}

// removeRangeRoute deletes the range's unreachable route, if it exists.
func (m *Manager) removeRangeRoute() error {
	if err := m.nl.RouteDel(m.rangeRoute()); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("network: removing the unreachable route for %s: %w", m.cfg.CIDR, err)
	}
	return nil
}
