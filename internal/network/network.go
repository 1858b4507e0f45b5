// Package network gives every sandbox its own network: a slot.
//
// A slot is a named network namespace (bind-mounted at /run/netns/<name>,
// as `ip netns` does), a veth pair whose host end stays in the root
// namespace and whose peer is eth0 inside the slot, and a /30 of the
// configured range: the host end has the first usable address, eth0 the
// second, and eth0's default route points at the host end.
//
// Lifecycle: New installs Warren's nftables tables (NAT for egress,
// isolation filters) and starts a pool filler that keeps Config.PoolSize
// slots ready, because building one costs a few milliseconds that a sandbox
// create should not pay. Acquire hands out a ready slot (or builds one when
// the pool is empty); Release tears it down completely and frees its subnet.
// Close stops the filler and tears down pooled slots but leaves the nftables
// tables, so sandboxes that outlive a restart of the control plane stay
// isolated; Destroy also removes the tables. Cleanup removes slots left by
// a crashed run that the caller does not know.
//
// Isolation, enforced in nftables: traffic entering the host from a slot is
// dropped unless it answers a connection the host opened (the platform
// dials into sandboxes; sandboxes never reach host services), traffic from
// one slot to another is dropped, and traffic to anywhere else leaves
// through the host with its source masqueraded.
package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
)

// Config configures a Manager. Zero fields take the defaults.
type Config struct {
	// CIDR is the range slots' /30s are cut from. Default 10.11.0.0/16.
	CIDR netip.Prefix
	// Prefix names everything this manager creates: namespaces are
	// "<prefix>-<id>", host veths "<prefix>v<id>", nftables tables
	// "<prefix>" and "<prefix>_nat". At most 6 characters. Default "wrn".
	Prefix string
	// PoolSize is how many ready slots are kept. Default 4; negative: none.
	PoolSize int
}

// Slot is one sandbox's network.
type Slot struct {
	ID        int
	Name      string // network namespace name
	NetNSPath string // /run/netns/<Name>
	HostVeth  string // host end of the veth pair
	HostIP    netip.Addr
	SandboxIP netip.Addr
	PrefixLen int
}

const netnsDir = "/run/netns"

// Manager hands out slots. It is safe for concurrent use.
type Manager struct {
	cfg  Config
	base netip.Addr // first address of CIDR
	max  int        // number of /30s in CIDR

	mu     sync.Mutex
	used   map[int]*Slot // reserved IDs; the slot once built
	out    map[int]bool  // IDs handed out by Acquire and not yet released
	next   int
	closed bool

	pool   chan *Slot
	refill chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
}

// New validates cfg, installs the nftables tables and starts the pool.
func New(cfg Config) (*Manager, error) {
	if !cfg.CIDR.IsValid() {
		cfg.CIDR = netip.MustParsePrefix("10.11.0.0/16")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "wrn"
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 4
	}
	if cfg.PoolSize < 0 {
		cfg.PoolSize = 0
	}
	if len(cfg.Prefix) > 6 || strings.ContainsAny(cfg.Prefix, "-/ ") {
		return nil, fmt.Errorf("network: prefix %q must be at most 6 characters without '-', '/' or spaces", cfg.Prefix)
	}
	if !cfg.CIDR.Addr().Is4() || cfg.CIDR.Bits() > 30 {
		return nil, fmt.Errorf("network: range %s must be IPv4 and at least a /30", cfg.CIDR)
	}
	cfg.CIDR = cfg.CIDR.Masked()
	m := &Manager{
		cfg:    cfg,
		base:   cfg.CIDR.Addr(),
		max:    1 << (30 - cfg.CIDR.Bits()),
		used:   map[int]*Slot{},
		out:    map[int]bool{},
		pool:   make(chan *Slot, cfg.PoolSize),
		refill: make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("network: enabling IPv4 forwarding: %w", err)
	}
	if err := m.installRules(); err != nil {
		return nil, err
	}
	if cfg.PoolSize > 0 {
		m.wg.Add(1)
		go m.fill()
		m.kick()
	}
	return m, nil
}

// Acquire returns a ready slot, from the pool when it has one.
func (m *Manager) Acquire(ctx context.Context) (*Slot, error) {
	var s *Slot
	select {
	case s = <-m.pool:
		m.kick()
	default:
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m.kick()
		var err error
		if s, err = m.create(); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	m.out[s.ID] = true
	m.mu.Unlock()
	return s, nil
}

// Release tears the slot down and frees its subnet. Releasing a slot twice
// is harmless, even after its subnet went to another slot.
func (m *Manager) Release(s *Slot) error {
	if s == nil {
		return nil
	}
	m.mu.Lock()
	live := m.used[s.ID] == s
	m.mu.Unlock()
	if !live {
		return nil
	}
	err := m.teardown(s)
	m.mu.Lock()
	delete(m.used, s.ID)
	delete(m.out, s.ID)
	m.mu.Unlock()
	return err
}

// Close stops the pool and tears down its ready slots. Slots handed out
// and the nftables tables are left as they are.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	m.wg.Wait()
	var errs []error
	for {
		select {
		case s := <-m.pool:
			errs = append(errs, m.Release(s))
		default:
			return errors.Join(errs...)
		}
	}
}

// Destroy closes the manager and removes its nftables tables.
func (m *Manager) Destroy() error {
	return errors.Join(m.Close(), m.removeRules())
}

// IsPooled reports whether the namespace name belongs to a ready slot in
// the pool (built, not handed out).
func (m *Manager) IsPooled(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, s := range m.used {
		if s != nil && s.Name == name && !m.out[id] {
			return true
		}
	}
	return false
}

func (m *Manager) kick() {
	select {
	case m.refill <- struct{}{}:
	default:
	}
}

// fill keeps the pool full; a failure is retried at the next kick.
func (m *Manager) fill() {
	defer m.wg.Done()
	for {
		select {
		case <-m.stop:
			return
		case <-m.refill:
		}
		for len(m.pool) < cap(m.pool) {
			s, err := m.create()
			if err != nil {
				break
			}
			select {
			case m.pool <- s:
			case <-m.stop:
				_ = m.Release(s)
				return
			}
		}
	}
}

// allocate reserves a free /30.
func (m *Manager) allocate() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := 0; i < m.max; i++ {
		id := (m.next + i) % m.max
		if _, taken := m.used[id]; !taken {
			m.used[id] = nil
			m.next = id + 1
			return id, nil
		}
	}
	return 0, fmt.Errorf("network: all %d slots of %s are in use", m.max, m.cfg.CIDR)
}

func (m *Manager) slot(id int) *Slot {
	b := m.base.As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n += uint32(id) * 4
	addr := func(off uint32) netip.Addr {
		v := n + off
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	name := m.nsName(id)
	return &Slot{
		ID:        id,
		Name:      name,
		NetNSPath: netnsDir + "/" + name,
		HostVeth:  m.vethName(id),
		HostIP:    addr(1),
		SandboxIP: addr(2),
		PrefixLen: 30,
	}
}

func (m *Manager) nsName(id int) string   { return fmt.Sprintf("%s-%d", m.cfg.Prefix, id) }
func (m *Manager) vethName(id int) string { return fmt.Sprintf("%sv%d", m.cfg.Prefix, id) }
