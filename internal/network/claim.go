package network

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// CheckRangeFree reports whether cidr is free for a manager of prefix on
// this host: no interface address in it, and no route into it, but those
// such a manager makes itself (a previous run's, which New adopts or
// cleans up): routes through its veths and the range's unreachable route
// of exactly cidr. Anything else is another server's range or a network
// the host uses, and a manager started over it would break one or the
// other. The caller keeps other managers of prefix and of cidr away
// (warren serve holds a lock on each).
func CheckRangeFree(cidr netip.Prefix, prefix string) error {
	cfg, err := Config{CIDR: cidr, Prefix: prefix}.normalize()
	if err != nil {
		return err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("network: netlink: %w", err)
	}
	defer h.Close()
	links := map[int]string{}
	if ls, err := whole(h.LinkList); err == nil {
		for _, l := range ls {
			links[l.Attrs().Index] = l.Attrs().Name
		}
	}
	ours := func(linkIndex int) bool {
		_, ok := cfg.parseID(links[linkIndex], "v")
		return ok
	}
	addrs, err := whole(func() ([]netlink.Addr, error) { return h.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("network: listing addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && cfg.CIDR.Contains(ip) && !ours(a.LinkIndex) {
			return fmt.Errorf("network: range %s is in use on this host: interface %s has address %s (another warren serve, or a network of this host); choose another range with --network-cidr",
				cfg.CIDR, links[a.LinkIndex], a.IPNet)
		}
	}
	routes, err := whole(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return fmt.Errorf("network: listing routes: %w", err)
	}
	for _, r := range routes {
		dst, ok := routeDst(r.Dst)
		if !ok || dst.Bits() == 0 || !dst.Overlaps(cfg.CIDR) || r.Table == unix.RT_TABLE_LOCAL {
			continue // default routes lead anywhere; local ones are the addresses above
		}
		if ours(r.LinkIndex) || r.Type == unix.RTN_UNREACHABLE && dst == cfg.CIDR && r.Priority == rangeRouteMetric {
			continue
		}
		via := links[r.LinkIndex]
		if r.Type == unix.RTN_UNREACHABLE {
			via = "unreachable"
		}
		return fmt.Errorf("network: range %s overlaps the route to %s (%s, table %d) on this host: another warren serve's range, or a network of this host; choose another range with --network-cidr",
			cfg.CIDR, dst, via, r.Table)
	}
	return nil
}

func routeDst(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP.To4())
	if !ok {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(ip, bits).Masked(), true
}
