package network

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
)

func (m *Manager) filterTable() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Prefix, Family: nftables.TableFamilyINet}
}

func (m *Manager) natTable() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Prefix + "_nat", Family: nftables.TableFamilyIPv4}
}

// installRules (re)creates Warren's tables in one atomic batch, so running
// sandboxes are never left without their isolation rules.
func (m *Manager) installRules() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	if err := m.deleteTables(c); err != nil {
		return err
	}
	vethPrefix := []byte(m.cfg.Prefix + "v")

	filter := c.AddTable(m.filterTable())
	accept := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{
		Name: "input", Table: filter, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	// Replies to connections the host opened into a sandbox are let in...
	c.AddRule(&nftables.Rule{Table: filter, Chain: input, Exprs: concat(
		ifname(expr.MetaKeyIIFNAME, vethPrefix),
		establishedOrRelated(),
		verdict(expr.VerdictAccept),
	)})
	// ...anything else a sandbox sends to the host itself is dropped.
	c.AddRule(&nftables.Rule{Table: filter, Chain: input, Exprs: concat(
		ifname(expr.MetaKeyIIFNAME, vethPrefix),
		verdict(expr.VerdictDrop),
	)})
	forward := c.AddChain(&nftables.Chain{
		Name: "forward", Table: filter, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	// Sandboxes never reach each other.
	c.AddRule(&nftables.Rule{Table: filter, Chain: forward, Exprs: concat(
		ifname(expr.MetaKeyIIFNAME, vethPrefix),
		ifname(expr.MetaKeyOIFNAME, vethPrefix),
		verdict(expr.VerdictDrop),
	)})

	nat := c.AddTable(m.natTable())
	post := c.AddChain(&nftables.Chain{
		Name: "postrouting", Table: nat, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	})
	// Egress to anywhere outside the range leaves with the host's address.
	c.AddRule(&nftables.Rule{Table: nat, Chain: post, Exprs: concat(
		ipInRange(12, m.cfg.CIDR.Addr().AsSlice(), m.cfg.CIDR.Bits(), expr.CmpOpEq),
		ipInRange(16, m.cfg.CIDR.Addr().AsSlice(), m.cfg.CIDR.Bits(), expr.CmpOpNeq),
		[]expr.Any{&expr.Masq{}},
	)})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: installing nftables rules: %w", err)
	}
	return nil
}

// removeRules deletes Warren's tables.
func (m *Manager) removeRules() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if err := m.deleteTables(c); err != nil {
		return err
	}
	return c.Flush()
}

// deleteTables queues the deletion of whichever of our tables exist.
func (m *Manager) deleteTables(c *nftables.Conn) error {
	tables, err := c.ListTables()
	if err != nil {
		return fmt.Errorf("network: listing nftables tables: %w", err)
	}
	for _, want := range []*nftables.Table{m.filterTable(), m.natTable()} {
		for _, t := range tables {
			if t.Name == want.Name && t.Family == want.Family {
				c.DelTable(t)
			}
		}
	}
	return nil
}

// tablesPresent reports which of our tables exist (for tests).
func (m *Manager) tablesPresent() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	tables, err := c.ListTables()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range tables {
		if t.Name == m.filterTable().Name || t.Name == m.natTable().Name {
			out = append(out, t.Name)
		}
	}
	return out, nil
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ifname matches interface names starting with prefix (nft's "name*"):
// comparing fewer bytes than the register holds is a prefix match.
func ifname(key expr.MetaKey, prefix []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: prefix},
	}
}

func establishedOrRelated() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// ipInRange compares the IPv4 address at offset (12 source, 16
// destination) of the network header with a prefix.
func ipInRange(offset uint32, network []byte, bits int, op expr.CmpOp) []expr.Any {
	mask := make([]byte, 4)
	for i := 0; i < bits; i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: network},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
