package network

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Why released ids are "dirty": a conntrack entry that outlives its slot
// would let the next holder of the address send "replies" into a
// connection the host still has open to the previous sandbox, past the
// input filter. So an id's flows are deleted before its /30 is reused.
//
// Deleting means dumping the whole conntrack table (its cost grows with
// the table's hash size: about 6 ms here for a dozen entries), so it is
// not done per Release. Released ids wait as dirty, unused (the allocator
// prefers never-used and flushed ids), until no free id is left; then one
// dump deletes the flows of all of them. Until then their flows are
// harmless: no interface has those addresses, and the anti-spoofing rule
// stops anyone else from using them.

// flushDirty deletes the conntrack flows of every dirty id, then frees them.
func (m *Manager) flushDirty() error {
	m.flushMu.Lock() // concurrent creators share one flush
	defer m.flushMu.Unlock()
	m.mu.Lock()
	addrs := map[netip.Addr]bool{}
	var ids []int
	for id, e := range m.ids {
		if e.state == stateDirty {
			ids = append(ids, id)
			addrs[m.cfg.slot(id).SandboxIP] = true
		}
	}
	m.mu.Unlock()
	if len(ids) == 0 {
		return nil // another creator flushed them
	}
	if err := m.deleteFlows(flowsOf(addrs)); err != nil {
		return fmt.Errorf("network: deleting conntrack flows of released slots: %w", err)
	}
	m.mu.Lock()
	for _, id := range ids {
		if e := m.ids[id]; e != nil && e.state == stateDirty {
			delete(m.ids, id)
		}
	}
	m.mu.Unlock()
	return nil
}

// flowsOf matches flows that a sandbox address opened or accepted.
type flowsOf map[netip.Addr]bool

func (f flowsOf) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, _ := netip.AddrFromSlice(flow.Forward.SrcIP.To4())
	dst, _ := netip.AddrFromSlice(flow.Forward.DstIP.To4())
	return f[src] || f[dst]
}
