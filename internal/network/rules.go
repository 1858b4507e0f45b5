package network

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// installRules replaces Warren's tables in one atomic batch: a restarted
// manager never leaves running sandboxes without rules, not even briefly.
// The filters match slots by veth name prefix, so they hold for every slot,
// present and future, and no rule changes per slot.
func (m *Manager) installRules() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	// The slot policies of the tables being replaced (a previous run's,
	// whose sandboxes may still run) go into the new ones in the same
	// transaction.
	saved, err := m.readPolicies(c)
	if err != nil {
		return err
	}
	if err := m.queueDeleteTables(c); err != nil {
		return err
	}
	slots := []byte(m.cfg.Prefix + "v") // a veth name prefix match, like nft's "wrnv*"
	accept := nftables.ChainPolicyAccept

	filter := c.AddTable(&nftables.Table{Name: m.cfg.filterTable(), Family: nftables.TableFamilyINet})
	chain := func(name string, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: filter, Type: nftables.ChainTypeFilter,
			Hooknum: hook, Priority: prio, Policy: &accept})
	}
	rule := func(ch *nftables.Chain, parts ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: filter, Chain: ch, Exprs: concat(parts...)})
	}
	// refuse answers what match matches with a TCP reset, or an ICMP
	// admin-prohibited error for anything else: a sandbox's connection
	// that is not allowed fails at once instead of hanging until its
	// timeout. (Spoofed packets are dropped instead: nothing answers a
	// forged source.)
	refuse := func(ch *nftables.Chain, match ...[]expr.Any) {
		rule(ch, concat(match...), l4proto(unix.IPPROTO_TCP), countAndReject(unix.NFT_REJECT_TCP_RST, 0))
		rule(ch, concat(match...), countAndReject(unix.NFT_REJECT_ICMPX_UNREACH, unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED))
	}

	// Anti-spoofing, at raw priority so that conntrack never records a
	// spoofed flow: a packet from a slot must come from an address routed
	// back through that slot's veth, i.e. its own /30.
	pre := chain("prerouting", nftables.ChainHookPrerouting, nftables.ChainPriorityRaw)
	rule(pre, ifnamePrefix(expr.MetaKeyIIFNAME, slots), sourceNotRoutedBack(), countAndDrop())

	// Each slot's bounds on new connections (limits.go).
	if err := m.addLimits(c, filter, slots); err != nil {
		return err
	}

	// Sandboxes reach no host service, on any host address: only replies
	// to connections the host opened (the platform dials into sandboxes),
	// and ICMP errors about them, get in.
	in := chain("input", nftables.ChainHookInput, nftables.ChainPriorityFilter)
	rule(in, ifnamePrefix(expr.MetaKeyIIFNAME, slots), ctEstablishedOrRelated(), verdict(expr.VerdictAccept))
	if port := m.cfg.ProxyPort; port != 0 {
		// The egress proxy takes the connections redirected to it from
		// proxied slots (policy.go), and nothing else: not a sandbox
		// dialling the host's address, not another host.
		proxyPort := concat(l4proto(unix.IPPROTO_TCP), dport(port))
		rule(in, ifnamePrefix(expr.MetaKeyIIFNAME, slots), proxyPort, ctStatusDNAT(), verdict(expr.VerdictAccept))
		refuse(in, ifnameNotPrefix(expr.MetaKeyIIFNAME, slots), proxyPort, ctNotEstablishedOrRelated())
	}
	refuse(in, ifnamePrefix(expr.MetaKeyIIFNAME, slots))

	// The same, before the host's own port forwards (DNAT, at -100) can
	// turn a connection to a host address into one to somewhere else:
	// a sandbox opens nothing to a host address, forwarded or not.
	preHost := chain("prerouting_host", nftables.ChainHookPrerouting, nftables.ChainPriorityMangle)
	refuse(preHost, ifnamePrefix(expr.MetaKeyIIFNAME, slots), daddrIsLocal(), ctNotEstablishedOrRelated())

	// Sandboxes never reach each other, and slots are IPv4-only. These
	// come before the egress policy, so no allowed range opens them.
	fwd := chain("forward", nftables.ChainHookForward, nftables.ChainPriorityFilter)
	refuse(fwd, ifnamePrefix(expr.MetaKeyIIFNAME, slots), ifnamePrefix(expr.MetaKeyOIFNAME, slots))
	rule(fwd, ifnamePrefix(expr.MetaKeyIIFNAME, slots), nfproto(nftables.TableFamilyIPv6), countAndDrop())

	// The egress policy (egress.go): DNS to the resolvers, then the
	// blocked ranges refused at once.
	resolvers, blocked, err := m.addEgressSets(c, filter)
	if err != nil {
		return err
	}
	toSet := func(set *nftables.Set) []expr.Any {
		return concat(ifnamePrefix(expr.MetaKeyIIFNAME, slots), nfproto(nftables.TableFamilyIPv4), ipv4DaddrIn(set))
	}
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(fwd, toSet(resolvers), l4proto(proto), dport(53), verdict(expr.VerdictAccept))
	}
	refuse(fwd, toSet(blocked))

	// Then each slot's own policy (policy.go).
	policies := &nftables.Set{Table: filter, Name: policiesMap, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	if err := c.AddSet(policies, nil); err != nil {
		return fmt.Errorf("network: nftables map of slot policies: %w", err)
	}
	proxied := &nftables.Set{Table: filter, Name: proxiedSet, KeyType: nftables.TypeIFName}
	if err := c.AddSet(proxied, nil); err != nil {
		return fmt.Errorf("network: nftables set of proxied slots: %w", err)
	}
	rule(fwd, ifnamePrefix(expr.MetaKeyIIFNAME, slots), ifnameVmap(policiesMap))
	if port := m.cfg.ProxyPort; port != 0 {
		m.addProxyChain(c, filter, port, resolvers, blocked)
	}
	for id, sp := range saved {
		if err := m.queueAddSlotPolicy(c, filter, id, m.cfg.vethName(id), sp.allow, sp.deny, sp.proxied && port(m) != 0); err != nil {
			return err
		}
	}

	// Egress leaves with the host's address.
	nat := c.AddTable(&nftables.Table{Name: m.cfg.natTable(), Family: nftables.TableFamilyIPv4})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: nat, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	out := ifnameNotPrefix(expr.MetaKeyOIFNAME, slots) // with no uplink: any interface but a slot's
	if m.uplink != "" {
		out = ifnameExact(expr.MetaKeyOIFNAME, m.uplink)
	}
	c.AddRule(&nftables.Rule{Table: nat, Chain: post, Exprs: concat(
		ipv4Prefix(ipv4SourceOffset, m.cfg.CIDR, expr.CmpOpEq),
		out,
		[]expr.Any{&expr.Masq{}},
	)})

	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: installing nftables tables: %w", err)
	}
	m.polMu.Lock()
	for id, sp := range saved {
		m.policies[id] = sp.proxied && port(m) != 0
	}
	m.polMu.Unlock()
	return nil
}

func port(m *Manager) uint16 { return m.cfg.ProxyPort }

// addProxyChain adds the nat chain that redirects proxied slots' new TCP
// connections to the egress proxy, except those the node refuses anyway
// (left to the forward chain) and DNS to the resolvers.
func (m *Manager) addProxyChain(c *nftables.Conn, filter *nftables.Table, port uint16, resolvers, blocked *nftables.Set) {
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: proxyChain, Table: filter, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	rule := func(parts ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: filter, Chain: ch, Exprs: concat(parts...)})
	}
	tcpFromProxied := concat(ifnameIn(expr.MetaKeyIIFNAME, proxiedSet), nfproto(nftables.TableFamilyIPv4), l4proto(unix.IPPROTO_TCP))
	rule(tcpFromProxied, ipv4DaddrIn(resolvers), dport(53), verdict(expr.VerdictReturn))
	rule(tcpFromProxied, ipv4DaddrIn(blocked), verdict(expr.VerdictReturn))
	rule(tcpFromProxied, ipv4DaddrPrefix(m.cfg.CIDR), verdict(expr.VerdictReturn))
	rule(tcpFromProxied, redirectTo(port))
}

// addEgressSets adds the sets the egress rules look destinations up in:
// the resolvers' addresses, and the blocked ranges less the allowed ones.
func (m *Manager) addEgressSets(c *nftables.Conn, table *nftables.Table) (resolvers, blocked *nftables.Set, err error) {
	resolvers = &nftables.Set{Table: table, Name: "resolvers", KeyType: nftables.TypeIPAddr}
	var elems []nftables.SetElement
	for _, a := range m.cfg.Resolvers {
		elems = append(elems, nftables.SetElement{Key: a.AsSlice()})
	}
	if err := c.AddSet(resolvers, elems); err != nil {
		return nil, nil, fmt.Errorf("network: nftables set of resolvers: %w", err)
	}
	blocked = &nftables.Set{Table: table, Name: "blocked", KeyType: nftables.TypeIPAddr, Interval: true}
	elems = nil
	for _, r := range blockedIntervals(m.cfg.AllowPrivate) {
		elems = append(elems, nftables.SetElement{Key: addrOf(r.first).AsSlice()})
		// An interval ends at the address after its last; one that runs
		// to the top of the address space has no end element.
		if r.last != ^uint32(0) {
			elems = append(elems, nftables.SetElement{Key: addrOf(r.last + 1).AsSlice(), IntervalEnd: true})
		}
	}
	if err := c.AddSet(blocked, elems); err != nil {
		return nil, nil, fmt.Errorf("network: nftables set of blocked ranges: %w", err)
	}
	return resolvers, blocked, nil
}

// removeRules deletes Warren's tables, if they exist.
func (m *Manager) removeRules() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	if err := m.queueDeleteTables(c); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: removing nftables tables: %w", err)
	}
	return nil
}

// queueDeleteTables adds the deletion of whichever of our tables exist to
// c's batch. Tables are matched by name and family; others are not touched.
func (m *Manager) queueDeleteTables(c *nftables.Conn) error {
	tables, err := c.ListTables()
	if err != nil {
		return fmt.Errorf("network: listing nftables tables: %w", err)
	}
	for _, t := range tables {
		if m.ownsTable(t) {
			c.DelTable(t)
		}
	}
	return nil
}

func (m *Manager) ownsTable(t *nftables.Table) bool {
	return (t.Family == nftables.TableFamilyINet && t.Name == m.cfg.filterTable()) ||
		(t.Family == nftables.TableFamilyIPv4 && t.Name == m.cfg.natTable())
}

// defaultUplink returns the interface of the IPv4 default route with the
// lowest metric, or "" when there is none.
func defaultUplink(h *netlink.Handle) (string, error) {
	routes, err := whole(func() ([]netlink.Route, error) { return h.RouteList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return "", fmt.Errorf("network: listing routes: %w", err)
	}
	best, bestPrio := 0, -1
	for _, r := range routes {
		isDefault := r.Dst == nil || (r.Dst.IP.IsUnspecified() && r.Dst.Mask != nil && isZeroMask(r.Dst.Mask))
		if isDefault && r.LinkIndex > 0 && (bestPrio < 0 || r.Priority < bestPrio) {
			best, bestPrio = r.LinkIndex, r.Priority
		}
	}
	if best == 0 {
		return "", nil
	}
	link, err := h.LinkByIndex(best)
	if err != nil {
		return "", fmt.Errorf("network: default route interface: %w", err)
	}
	return link.Attrs().Name, nil
}

func isZeroMask(m []byte) bool {
	for _, b := range m {
		if b != 0 {
			return false
		}
	}
	return true
}
