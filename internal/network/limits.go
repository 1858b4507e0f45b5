package network

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Per-slot connection bounds.
//
// Every connection a sandbox starts is a conntrack entry of the host, and
// the host's table is one for everybody: a sandbox that sends a datagram
// to each of 60000 ports holds 60000 entries for the UDP timeout (30 s),
// and a few such sandboxes fill the table, after which the kernel drops
// every new connection of every sandbox and of the node itself. So each
// slot gets two bounds, kept by the kernel in the chain "limits"
// (prerouting, after conntrack has seen the packet and before any NAT, so
// connections redirected to the egress proxy count too):
//
//   - Config.ConnRate: new connections per second, burst twice that, in
//     the dynamic set "connrate" keyed by the slot's veth (nft's
//     `add @connrate { iifname limit rate over R/second burst 2R packets }`).
//     Over it, the first packet is dropped: TCP retries the SYN a second
//     later, as it would on a congested link, and UDP loses the datagram.
//   - Config.MaxConns: connections open at once, in the dynamic set
//     "conncount" (`add @conncount { iifname ct count over N }`). Over
//     it, TCP gets a reset (the program sees ECONNREFUSED at once) and
//     anything else is dropped.
//
// A dropped first packet's conntrack entry was never confirmed, so it
// takes no room in the table: a flooding slot holds at most MaxConns
// entries, and another slot's bounds are its own. Only connections a slot
// starts count; the node's connections into sandboxes (their replies are
// "established") and its own elsewhere do not. The egress proxy's
// upstream connections are the node's: a proxied slot's connections can
// take up to twice MaxConns entries, one to the proxy and one onwards.
//
// The sets' counters start empty when New replaces the tables (a restart
// does not carry them over): for a moment after, a running slot can hold
// up to its old connections plus MaxConns.

const (
	limitsChain   = "limits"
	connRateSet   = "connrate"
	connCountSet  = "conncount"
	connBurstRate = 2 // the burst is this many seconds of ConnRate
)

// addLimits adds the limits chain and its sets to the filter table, or
// nothing when both bounds are off.
func (m *Manager) addLimits(c *nftables.Conn, filter *nftables.Table, slots []byte) error {
	maxConns, rate := m.cfg.MaxConns, m.cfg.ConnRate
	if maxConns < 0 && rate < 0 {
		return nil
	}
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: limitsChain, Table: filter, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	// A slot's new connection: the keyed expressions below find or make
	// the slot's element (keyed by its veth name, which anti-spoofing
	// ties to its address) and judge the packet with its state.
	newFromSlot := func() []expr.Any {
		return concat(ifnamePrefix(expr.MetaKeyIIFNAME, slots), ctNew(),
			[]expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}})
	}
	rule := func(parts ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: filter, Chain: ch, Exprs: concat(parts...)})
	}
	// One element per slot that ever sent: at most the range's slots.
	size := uint32(m.cfg.slotCount())
	if rate > 0 {
		set := &nftables.Set{Table: filter, Name: connRateSet, KeyType: nftables.TypeIFName, Dynamic: true, Size: size}
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("network: nftables set %s: %w", connRateSet, err)
		}
		over := &expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(rate), Unit: expr.LimitTimeSecond,
			Burst: uint32(connBurstRate * rate), Over: true}
		rule(newFromSlot(), addToSet(set, over), countAndDrop())
	}
	if maxConns > 0 {
		set := &nftables.Set{Table: filter, Name: connCountSet, KeyType: nftables.TypeIFName, Dynamic: true, Size: size}
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("network: nftables set %s: %w", connCountSet, err)
		}
		over := func() *expr.Connlimit { return &expr.Connlimit{Count: uint32(maxConns), Flags: nftConnlimitInvert} }
		// Each packet is counted by one of the two rules: the protocol
		// is matched before the key is loaded.
		rule(ifnamePrefix(expr.MetaKeyIIFNAME, slots), ctNew(), l4proto(unix.IPPROTO_TCP),
			[]expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}}, addToSet(set, over()),
			countAndReject(unix.NFT_REJECT_TCP_RST, 0))
		rule(ifnamePrefix(expr.MetaKeyIIFNAME, slots), ctNew(), notL4proto(unix.IPPROTO_TCP),
			[]expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}}, addToSet(set, over()),
			countAndDrop())
	}
	return nil
}

// nftConnlimitInvert is NFT_CONNLIMIT_F_INV: "ct count over N" matches
// when the count is above N (without it, "ct count N" when at most N).
const nftConnlimitInvert = 1

// addToSet is nft's "add @set { <key in register 1> <stateful expr> }":
// the element for the key is made if missing, then e judges the packet
// with the element's own state.
func addToSet(set *nftables.Set, e expr.Any) []expr.Any {
	return []expr.Any{&expr.Dynset{SrcRegKey: 1, SetName: set.Name, SetID: set.ID,
		Operation: unix.NFT_DYNSET_OP_ADD, Exprs: []expr.Any{e}}}
}

// notL4proto is nft's "meta l4proto != proto".
func notL4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{proto}},
	}
}
