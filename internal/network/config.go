package network

import (
	"fmt"
	"net/netip"
	"strconv"
)

// Config configures a Manager. Zero fields take the defaults.
type Config struct {
	// CIDR is the IPv4 range that slots' /30s are cut from.
	// Default 10.11.0.0/16 (16384 slots).
	CIDR netip.Prefix
	// Prefix names everything the manager creates: namespaces
	// "<prefix>-<id>", host veths "<prefix>v<id>", nftables tables
	// "warren_<prefix>" and "warren_<prefix>_nat". Lower-case letters and
	// digits, starting with a letter; short enough that the longest veth
	// name fits IFNAMSIZ. Managers sharing a host need distinct prefixes,
	// and none may begin with another's followed by "v" ("wrn", "wrnv1"),
	// since rules match veths by name prefix. Default "wrn".
	Prefix string
	// PoolSize is how many ready slots the filler keeps. Default 16, so
	// that a burst of creates takes ready slots: 20 concurrent creates
	// building theirs at once waited 258 ms p50 for them (netlink and
	// nftables work serialised in the kernel), 0.03 ms with the pool.
	// Negative: no pool, every Acquire builds its slot.
	PoolSize int
	// Uplink is the interface egress is masqueraded out of. Default: the
	// interface of the host's IPv4 default route when New runs; with no
	// default route, any interface that is not a slot's.
	Uplink string
	// AllowPrivate are ranges that sandboxes may reach although they lie
	// in BlockedRanges (internal services an operator wants to expose).
	// Each must be IPv4 and overlap a blocked range. Sandboxes still never
	// reach the host or each other, whatever is allowed.
	AllowPrivate []netip.Prefix
	// Resolvers are the DNS servers sandboxes use: port 53, UDP and TCP,
	// of exactly these addresses is open even when they lie in a blocked
	// range. IPv4 unicast, not loopback (a sandbox's loopback is its own).
	Resolvers []netip.Addr
	// ProxyPort is the host port the egress proxy listens on (on every
	// address): proxied slot policies redirect TCP there. 0: no proxy,
	// and SetPolicy refuses proxied policies.
	ProxyPort uint16
	// AuditGroup, if not 0, is the NFLOG group slot policies log each
	// new connection's verdict to (see policy.go).
	AuditGroup uint16
	// MaxConns bounds the connections (conntrack entries) each slot may
	// have open at once, TCP, UDP and anything else it starts (see
	// limits.go). 0: DefaultMaxConns; negative: no bound.
	MaxConns int
	// ConnRate bounds the new connections each slot may open per second,
	// with bursts of twice that. 0: DefaultConnRate; negative: no bound.
	ConnRate int
}

// Defaults.
var DefaultCIDR = netip.MustParsePrefix("10.11.0.0/16")

const (
	DefaultPrefix   = "wrn"
	DefaultPoolSize = 16
	// DefaultMaxConns and DefaultConnRate are a slot's connection bounds:
	// far above what a build or a crawler needs, far below the host's
	// conntrack table (262144 entries on a 4 GiB host), so that one
	// sandbox cannot fill it and cut every other one off.
	DefaultMaxConns = 8192
	DefaultConnRate = 200

	slotBits  = 30 // every slot gets a /30
	ifNameMax = 15 // IFNAMSIZ less the terminating NUL
)

// normalize fills in defaults and checks that every name the
// configuration can produce is valid.
func (c Config) normalize() (Config, error) {
	if !c.CIDR.IsValid() {
		c.CIDR = DefaultCIDR
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	switch {
	case c.PoolSize == 0:
		c.PoolSize = DefaultPoolSize
	case c.PoolSize < 0:
		c.PoolSize = 0
	}
	c.MaxConns = orDefault(c.MaxConns, DefaultMaxConns)
	c.ConnRate = orDefault(c.ConnRate, DefaultConnRate)
	if !c.CIDR.Addr().Is4() || c.CIDR.Bits() > slotBits {
		return c, fmt.Errorf("network: range %s must be IPv4 and hold at least one /%d", c.CIDR, slotBits)
	}
	c.CIDR = c.CIDR.Masked()
	if !validPrefix(c.Prefix) {
		return c, fmt.Errorf("network: prefix %q must be lower-case letters and digits, starting with a letter", c.Prefix)
	}
	// The veth name is the longest one: prefix, "v", the largest id.
	longest := len(c.Prefix) + 1 + len(strconv.Itoa(c.slotCount()-1))
	if longest > ifNameMax {
		return c, fmt.Errorf("network: prefix %q is too long for range %s: veth names would have %d characters, at most %d fit",
			c.Prefix, c.CIDR, longest, ifNameMax)
	}
	if len(c.Uplink) > ifNameMax {
		return c, fmt.Errorf("network: uplink %q is not an interface name", c.Uplink)
	}
	var err error
	if c.AllowPrivate, err = checkAllowed(c.AllowPrivate); err != nil {
		return c, err
	}
	if c.Resolvers, err = checkResolvers(c.Resolvers); err != nil {
		return c, err
	}
	return c, nil
}

// orDefault is v, def for 0, and -1 (no bound) for any negative v.
func orDefault(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return -1
	}
	return v
}

func validPrefix(p string) bool {
	for i, r := range p {
		letter := r >= 'a' && r <= 'z'
		if !letter && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return p != ""
}

// slotCount is the number of /30s in the range.
func (c Config) slotCount() int { return 1 << (slotBits - c.CIDR.Bits()) }

func (c Config) nsName(id int) string   { return c.Prefix + "-" + strconv.Itoa(id) }
func (c Config) vethName(id int) string { return c.Prefix + "v" + strconv.Itoa(id) }
func (c Config) filterTable() string    { return "warren_" + c.Prefix }
func (c Config) natTable() string       { return "warren_" + c.Prefix + "_nat" }

// parseID returns the id in a name made by nsName or vethName (whichever
// sep selects), rejecting anything this configuration could not have made.
func (c Config) parseID(name, sep string) (int, bool) {
	head := c.Prefix + sep
	if len(name) <= len(head) || name[:len(head)] != head {
		return 0, false
	}
	digits := name[len(head):]
	id, err := strconv.Atoi(digits)
	if err != nil || id < 0 || id >= c.slotCount() || strconv.Itoa(id) != digits {
		return 0, false
	}
	return id, true
}

// slot describes the slot with the given id; it builds nothing.
func (c Config) slot(id int) *Slot {
	first := c.CIDR.Addr().As4()
	n := uint32(first[0])<<24 | uint32(first[1])<<16 | uint32(first[2])<<8 | uint32(first[3])
	n += uint32(id) << (32 - slotBits)
	at := func(off uint32) netip.Addr {
		v := n + off
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	name := c.nsName(id)
	return &Slot{
		ID:        id,
		Name:      name,
		NetNSPath: netnsDir + "/" + name,
		HostVeth:  c.vethName(id),
		HostIP:    at(1),
		SandboxIP: at(2),
		PrefixLen: slotBits,
	}
}
