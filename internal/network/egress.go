package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The egress policy: what sandboxes may reach beyond their own slot.
//
// Sandboxes run hostile code, and a node usually sits inside a private
// network: its cloud's metadata service (169.254.169.254 hands out the
// node's credentials), the operator's internal services, other nodes. So
// every destination in BlockedRanges is refused unless Config.AllowPrivate
// opens part of it, and port 53 of Config.Resolvers is open so that DNS
// works even when the node's resolver is itself private. Everything else
// (the internet) is reachable.
//
// Refused connections fail at once: TCP gets a reset, anything else an
// ICMP "administratively prohibited", so a probe does not hang until its
// timeout. The ranges live in one nftables interval set, so the rules do
// not grow with the list.
//
// Allowing a range never opens the host or other sandboxes: those are
// decided before the egress rules (see rules.go), so allowing for example
// 10.0.0.0/8, which holds the slots' range, changes neither.

// BlockedRanges are the destinations sandboxes may not reach by default:
// RFC 1918 private networks, carrier-grade NAT (RFC 6598), link-local
// (cloud metadata), loopback, "this network", multicast and reserved.
var BlockedRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// PrefixList is a list of IPv4 ranges as a command-line flag: repeatable,
// and each value may hold several ranges separated by commas.
type PrefixList []netip.Prefix

func (l *PrefixList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, p := range *l {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (l *PrefixList) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return fmt.Errorf("%q is not a CIDR range such as 10.20.0.0/16", part)
		}
		*l = append(*l, p)
	}
	return nil
}

// checkAllowed validates Config.AllowPrivate and returns it masked, sorted
// and without duplicates.
func checkAllowed(in []netip.Prefix) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range in {
		if !p.IsValid() || !p.Addr().Is4() {
			return nil, fmt.Errorf("network: allowed range %s: only IPv4 ranges can be allowed (sandboxes have no IPv6)", p)
		}
		p = p.Masked()
		if !slices.ContainsFunc(BlockedRanges, p.Overlaps) {
			return nil, fmt.Errorf("network: allowed range %s is not blocked in the first place: it overlaps none of %v", p, BlockedRanges)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out), nil
}

// checkResolvers validates Config.Resolvers and returns them without
// duplicates, in their order.
func checkResolvers(in []netip.Addr) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, a := range in {
		if !a.Is4() || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return nil, fmt.Errorf("network: resolver %s: must be an IPv4 unicast address that is not loopback", a)
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// addrRange is the inclusive range of IPv4 addresses [first, last], as
// numbers.
type addrRange struct{ first, last uint32 }

func rangeOf(p netip.Prefix) addrRange {
	p = p.Masked()
	first := u32(p.Addr())
	return addrRange{first, first | (1<<(32-p.Bits()) - 1)}
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addrOf(n uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// blockedIntervals is BlockedRanges less the allowed ranges: sorted,
// disjoint, and with adjacent ranges merged (an interval set may not hold
// two ranges where one ends right where the next begins).
func blockedIntervals(allowed []netip.Prefix) []addrRange {
	var blocked []addrRange
	for _, p := range BlockedRanges {
		blocked = append(blocked, rangeOf(p))
	}
	for _, p := range allowed {
		a := rangeOf(p)
		var next []addrRange
		for _, b := range blocked {
			if a.last < b.first || a.first > b.last {
				next = append(next, b)
				continue
			}
			if b.first < a.first {
				next = append(next, addrRange{b.first, a.first - 1})
			}
			if b.last > a.last {
				next = append(next, addrRange{a.last + 1, b.last})
			}
		}
		blocked = next
	}
	slices.SortFunc(blocked, func(a, b addrRange) int {
		switch {
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return 0
	})
	var merged []addrRange
	for _, r := range blocked {
		if n := len(merged); n > 0 && merged[n-1].last != ^uint32(0) && merged[n-1].last+1 >= r.first {
			merged[n-1].last = max(merged[n-1].last, r.last)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}
