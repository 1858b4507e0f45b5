package network

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A slot's own egress policy (SetPolicy), on top of the node's.
//
// The node's rules (rules.go, egress.go) come first and always apply: no
// slot policy opens the host, another sandbox or a blocked range. Then
// the forward chain looks the packet's input interface up in the verdict
// map "policies" and jumps to the slot's chain p<id>, which refuses
// destinations in the slot's deny set pd<id> unless its allow set pa<id>
// holds them. Both are interval sets, so a thousand ranges cost the same
// lookup as one, and every packet is judged (not only a connection's
// first), so a narrower policy takes effect on open connections at once.
//
// A slot whose policy names domains, transforms or an upstream proxy is
// also in the set "proxied": the nat chain "proxy" redirects its new TCP
// connections to Config.ProxyPort on the host, where the egress proxy
// (internal/egress) sniffs the TLS SNI or HTTP Host and decides. The
// destinations the node refuses anyway (blocked ranges, other slots, port
// 53 of the resolvers) are not redirected, so the node's rules still
// refuse them in the forward chain. The input chain accepts the
// redirected connections to the proxy port, and only those: a sandbox
// dialling the host's address directly is still refused, and so is
// anybody reaching the port from outside the slots.
//
// When Config.AuditGroup is set, the slot chain logs each new
// connection's verdict to that NFLOG group (prefix "<A|D|O><id>": allowed
// by an allow entry, denied, allowed by default), at most auditRate per
// second per slot; internal/egress turns them into audit entries.
//
// SetPolicy replaces a slot's sets in one nftables transaction; Release
// removes the slot's objects with the slot. A restarted Manager (New)
// carries every slot's policy over from the tables it replaces, in the
// same transaction, so a running sandbox is never unrestricted.

// SlotPolicy is a slot's egress policy.
type SlotPolicy struct {
	// Allow and Deny are IPv4 ranges; allow wins over deny, and what
	// neither holds is allowed.
	Allow, Deny []netip.Prefix
	// Proxy sends the slot's TCP through the egress proxy.
	Proxy bool
}

// Empty reports whether the policy changes nothing.
func (p SlotPolicy) Empty() bool { return len(p.Allow) == 0 && len(p.Deny) == 0 && !p.Proxy }

// auditRate bounds the log entries one slot's chain sends per second
// (burst twice that): a sandbox opening connections in a loop cannot
// flood the audit.
const auditRate = 50

const (
	policiesMap = "policies"
	proxiedSet  = "proxied"
	proxyChain  = "proxy"
)

func slotChain(id int) string { return "p" + strconv.Itoa(id) }
func allowSet(id int) string  { return "pa" + strconv.Itoa(id) }
func denySet(id int) string   { return "pd" + strconv.Itoa(id) }

// AuditPrefix is the NFLOG prefix of a slot's verdicts: 'A' allowed by
// an allow entry, 'D' denied, 'O' allowed by default, then the slot id.
func AuditPrefix(verdict byte, id int) string { return string(verdict) + strconv.Itoa(id) }

// ParseAuditPrefix reverses AuditPrefix.
func ParseAuditPrefix(p string) (verdict byte, id int, ok bool) {
	p = strings.TrimRight(p, "\x00")
	if len(p) < 2 || !strings.ContainsRune("ADO", rune(p[0])) {
		return 0, 0, false
	}
	id, err := strconv.Atoi(p[1:])
	return p[0], id, err == nil && id >= 0
}

// SetPolicy gives slot s the policy p, replacing what it had, in one
// transaction. An empty policy removes the slot's policy.
func (m *Manager) SetPolicy(s *Slot, p SlotPolicy) error {
	if p.Proxy && m.cfg.ProxyPort == 0 {
		return errors.New("network: a proxied policy needs Config.ProxyPort")
	}
	allow, err := intervalElements(p.Allow)
	if err != nil {
		return err
	}
	deny, err := intervalElements(p.Deny)
	if err != nil {
		return err
	}
	if !m.owns(s) {
		return fmt.Errorf("network: slot %s is not out", s.Name)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	table := m.filter()
	m.polMu.Lock()
	defer m.polMu.Unlock()
	if proxied, had := m.policies[s.ID]; had {
		m.queueDeleteSlotPolicy(c, table, s.ID, s.HostVeth, proxied)
	}
	if !p.Empty() {
		if err := m.queueAddSlotPolicy(c, table, s.ID, s.HostVeth, allow, deny, p.Proxy); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: setting the egress policy of %s: %w", s.Name, err)
	}
	if p.Empty() {
		delete(m.policies, s.ID)
	} else {
		m.policies[s.ID] = p.Proxy
	}
	return nil
}

// clearPolicy removes a slot's policy objects, if it has any; Release
// calls it before the teardown.
func (m *Manager) clearPolicy(s *Slot) error {
	m.polMu.Lock()
	defer m.polMu.Unlock()
	proxied, had := m.policies[s.ID]
	if !had {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	m.queueDeleteSlotPolicy(c, m.filter(), s.ID, s.HostVeth, proxied)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: removing the egress policy of %s: %w", s.Name, err)
	}
	delete(m.policies, s.ID)
	return nil
}

func (m *Manager) filter() *nftables.Table {
	return &nftables.Table{Name: m.cfg.filterTable(), Family: nftables.TableFamilyINet}
}

func (m *Manager) owns(s *Slot) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.ids[s.ID]
	return e != nil && e.slot == s && e.state == stateOut
}

// queueAddSlotPolicy adds a slot's sets, chain, map element and proxied
// membership to c's batch. The deletion of an earlier version, if any,
// must come before it in the same batch.
func (m *Manager) queueAddSlotPolicy(c *nftables.Conn, table *nftables.Table, id int, veth string, allow, deny []nftables.SetElement, proxied bool) error {
	pa := &nftables.Set{Table: table, Name: allowSet(id), KeyType: nftables.TypeIPAddr, Interval: true}
	pd := &nftables.Set{Table: table, Name: denySet(id), KeyType: nftables.TypeIPAddr, Interval: true}
	if err := c.AddSet(pa, allow); err != nil {
		return fmt.Errorf("network: allow set of slot %d: %w", id, err)
	}
	if err := c.AddSet(pd, deny); err != nil {
		return fmt.Errorf("network: deny set of slot %d: %w", id, err)
	}
	ch := c.AddChain(&nftables.Chain{Name: slotChain(id), Table: table})
	rule := func(parts ...[]expr.Any) { c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: concat(parts...)}) }
	v4 := nfproto(nftables.TableFamilyIPv4)
	logNew := func(verdict byte) []expr.Any {
		return concat(ctNew(), limitPerSecond(auditRate), []expr.Any{&expr.Log{
			Key:   1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX,
			Group: m.cfg.AuditGroup, Data: []byte(AuditPrefix(verdict, id)),
		}})
	}
	audit := m.cfg.AuditGroup != 0
	if audit {
		rule(v4, ipv4DaddrIn(pa), logNew('A'))
	}
	rule(v4, ipv4DaddrIn(pa), verdict(expr.VerdictAccept))
	if audit {
		rule(v4, ipv4DaddrIn(pd), logNew('D'))
	}
	rule(v4, ipv4DaddrIn(pd), l4proto(unix.IPPROTO_TCP), countAndReject(unix.NFT_REJECT_TCP_RST, 0))
	rule(v4, ipv4DaddrIn(pd), countAndReject(unix.NFT_REJECT_ICMPX_UNREACH, unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED))
	if audit {
		rule(v4, logNew('O'))
	}
	key := ifnameKey(veth)
	if err := c.SetAddElements(&nftables.Set{Table: table, Name: policiesMap, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict},
		[]nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}); err != nil {
		return fmt.Errorf("network: policy map entry of slot %d: %w", id, err)
	}
	if proxied {
		if err := c.SetAddElements(&nftables.Set{Table: table, Name: proxiedSet, KeyType: nftables.TypeIFName},
			[]nftables.SetElement{{Key: key}}); err != nil {
			return fmt.Errorf("network: proxied entry of slot %d: %w", id, err)
		}
	}
	return nil
}

// queueDeleteSlotPolicy deletes a slot's map element (first: it refers to
// the chain), proxied membership, chain and sets.
func (m *Manager) queueDeleteSlotPolicy(c *nftables.Conn, table *nftables.Table, id int, veth string, proxied bool) {
	key := ifnameKey(veth)
	_ = c.SetDeleteElements(&nftables.Set{Table: table, Name: policiesMap, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict},
		[]nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: slotChain(id)}}})
	// Deleting an element that is not there fails the whole batch.
	if proxied {
		_ = c.SetDeleteElements(&nftables.Set{Table: table, Name: proxiedSet, KeyType: nftables.TypeIFName}, []nftables.SetElement{{Key: key}})
	}
	c.DelChain(&nftables.Chain{Name: slotChain(id), Table: table})
	c.DelSet(&nftables.Set{Table: table, Name: allowSet(id)})
	c.DelSet(&nftables.Set{Table: table, Name: denySet(id)})
}

// intervalElements turns ranges into an interval set's elements: merged,
// sorted, each start with the end (the address after its last) unless
// it runs to the top of the address space.
func intervalElements(ps []netip.Prefix) ([]nftables.SetElement, error) {
	var rs []addrRange
	for _, p := range ps {
		if !p.IsValid() || !p.Addr().Is4() {
			return nil, fmt.Errorf("network: policy range %s: only IPv4 ranges", p)
		}
		rs = append(rs, rangeOf(p))
	}
	slices.SortFunc(rs, func(a, b addrRange) int {
		switch {
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return 0
	})
	var merged []addrRange
	for _, r := range rs {
		if n := len(merged); n > 0 && (merged[n-1].last == ^uint32(0) || merged[n-1].last+1 >= r.first) {
			merged[n-1].last = max(merged[n-1].last, r.last)
			continue
		}
		merged = append(merged, r)
	}
	elems := make([]nftables.SetElement, 0, 2*len(merged))
	for _, r := range merged {
		elems = append(elems, nftables.SetElement{Key: addrOf(r.first).AsSlice()})
		if r.last != ^uint32(0) {
			elems = append(elems, nftables.SetElement{Key: addrOf(r.last + 1).AsSlice(), IntervalEnd: true})
		}
	}
	return elems, nil
}

// ifnameKey is an interface name as an ifname set key: NUL-padded.
func ifnameKey(name string) []byte {
	k := make([]byte, ifNameMax+1)
	copy(k, name)
	return k
}

// savedPolicy is a slot policy read back from the kernel.
type savedPolicy struct {
	allow, deny []nftables.SetElement
	proxied     bool
}

// readPolicies reads the slot policies of the filter table a previous
// manager (or run) installed, so that New can carry them over. No table,
// or one without policies, reads as none.
func (m *Manager) readPolicies(c *nftables.Conn) (map[int]savedPolicy, error) {
	out := map[int]savedPolicy{}
	table := m.filter()
	pm, err := c.GetSetByName(table, policiesMap)
	if err != nil {
		return out, nil // no such table or map: nothing to carry over
	}
	elems, err := c.GetSetElements(pm)
	if err != nil {
		return nil, fmt.Errorf("network: reading the slot policies: %w", err)
	}
	proxied := map[string]bool{}
	if ps, err := c.GetSetByName(table, proxiedSet); err == nil {
		pe, err := c.GetSetElements(ps)
		if err != nil {
			return nil, fmt.Errorf("network: reading the proxied slots: %w", err)
		}
		for _, e := range pe {
			proxied[strings.TrimRight(string(e.Key), "\x00")] = true
		}
	}
	for _, e := range elems {
		name := strings.TrimRight(string(e.Key), "\x00")
		id, ok := m.cfg.parseID(name, "v")
		if !ok {
			continue
		}
		var sp savedPolicy
		for _, x := range []struct {
			name string
			into *[]nftables.SetElement
		}{{allowSet(id), &sp.allow}, {denySet(id), &sp.deny}} {
			s, err := c.GetSetByName(table, x.name)
			if err != nil {
				return nil, fmt.Errorf("network: reading set %s: %w", x.name, err)
			}
			got, err := c.GetSetElements(s)
			if err != nil {
				return nil, fmt.Errorf("network: reading set %s: %w", x.name, err)
			}
			*x.into = sortedIntervals(got)
		}
		sp.proxied = proxied[name]
		out[id] = sp
	}
	return out, nil
}

// sortedIntervals orders interval elements read from the kernel (which
// lists them in its own order) by address, as AddSet wants them.
func sortedIntervals(es []nftables.SetElement) []nftables.SetElement {
	es = slices.Clone(es)
	slices.SortStableFunc(es, func(a, b nftables.SetElement) int {
		ka, kb := binaryutil.BigEndian.Uint32(pad4(a.Key)), binaryutil.BigEndian.Uint32(pad4(b.Key))
		switch {
		case ka < kb:
			return -1
		case ka > kb:
			return 1
		}
		return 0
	})
	// The kernel lists an implicit start element at 0.0.0.0 flagged as
	// an interval end when the set does not begin at 0: drop it.
	for len(es) > 0 && es[0].IntervalEnd {
		es = es[1:]
	}
	return es
}

func pad4(b []byte) []byte {
	if len(b) >= 4 {
		return b[:4]
	}
	out := make([]byte, 4)
	copy(out, b)
	return out
}

// Refused reports whether the node refuses sandboxes a connection to a:
// an address of the host, of a slot, in a blocked range (less
// Config.AllowPrivate), or not IPv4. The egress proxy dials from the
// host, where no forward chain applies, so it asks this first.
func (m *Manager) Refused(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() || m.cfg.CIDR.Contains(a) || a.IsUnspecified() {
		return true
	}
	n := u32(a)
	for _, r := range m.blocked {
		if n >= r.first && n <= r.last {
			return true
		}
	}
	return m.isLocal(a)
}

// isLocal reports whether a is one of the host's addresses, as the
// kernel routes it: addresses come and go, so the kernel's answer is kept
// only until the host's routes next change (localAnswers).
func (m *Manager) isLocal(a netip.Addr) bool {
	local, ok, gen := m.local.get(a)
	if ok {
		return local
	}
	routes, err := m.nl.RouteGetWithOptions(a.AsSlice(), &netlink.RouteGetOptions{})
	if err != nil || len(routes) == 0 {
		return true // fail closed, and not kept
	}
	local = routes[0].Type == unix.RTN_LOCAL || routes[0].Type == unix.RTN_BROADCAST || routes[0].Type == unix.RTN_MULTICAST
	m.local.put(a, local, gen)
	return local
}

// CutFlows deletes the conntrack flows slot s opened whose destination
// cut reports true: connections a new policy forbids end at once instead
// of living on in conntrack. (The slot chain refuses their next packets
// anyway; this also forgets the NAT state.) Connections redirected to
// the egress proxy are left alone: the proxy judges those itself.
func (m *Manager) CutFlows(s *Slot, cut func(dst netip.Addr) bool) error {
	err := m.deleteFlows(slotFlows{src: s.SandboxIP, host: s.HostIP, cut: cut})
	if err != nil {
		return fmt.Errorf("network: cutting the connections of %s: %w", s.Name, err)
	}
	return nil
}

type slotFlows struct {
	src, host netip.Addr
	cut       func(netip.Addr) bool
}

func (f slotFlows) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, _ := netip.AddrFromSlice(flow.Forward.SrcIP.To4())
	dst, _ := netip.AddrFromSlice(flow.Forward.DstIP.To4())
	replier, _ := netip.AddrFromSlice(flow.Reverse.SrcIP.To4())
	redirected := replier == f.host // answered by the host: the egress proxy
	return src == f.src && !redirected && f.cut(dst)
}
