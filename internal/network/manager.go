package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrClosed is returned by Acquire after Close.
var ErrClosed = errors.New("network: manager closed")

// ErrExhausted is returned by Acquire when every /30 of the range is taken.
var ErrExhausted = errors.New("network: no free slot in the range")

// Manager hands out slots. It is safe for concurrent use.
type Manager struct {
	cfg    Config
	uplink string          // interface egress is masqueraded out of; "" = any non-slot one
	nl     *netlink.Handle // root namespace: routes and links, conntrack

	mu     sync.Mutex
	ids    map[int]*entry // every id whose /30 is not free
	next   int            // where the next search for a free id starts
	closed bool
	active sync.WaitGroup // the filler and inline builds; Close waits for them

	flushMu sync.Mutex // one conntrack flush at a time

	blocked []addrRange // BlockedRanges less Config.AllowPrivate
	local   localAnswers

	polMu    sync.Mutex   // serialises policy transactions
	policies map[int]bool // slots with a policy; the value: proxied

	pool   chan *Slot    // ready slots; only the filler sends
	refill chan struct{} // wakes the filler
	stop   chan struct{} // closed by Close
}

// New checks cfg, enables IPv4 forwarding, installs the nftables tables
// and starts filling the pool.
func New(cfg Config) (*Manager, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	if err := prepareNetnsDir(); err != nil {
		return nil, err
	}
	// Host-wide and left on at Close: other users of the host may rely on it.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0); err != nil {
		return nil, fmt.Errorf("network: enabling IPv4 forwarding: %w", err)
	}
	// One socket, reused for every request, instead of one per request.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("network: netlink: %w", err)
	}
	m := &Manager{
		cfg:      cfg,
		uplink:   cfg.Uplink,
		nl:       h,
		ids:      map[int]*entry{},
		blocked:  blockedIntervals(cfg.AllowPrivate),
		policies: map[int]bool{},
		pool:     make(chan *Slot, cfg.PoolSize),
		refill:   make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	if m.uplink == "" {
		if m.uplink, err = defaultUplink(h); err != nil {
			h.Close()
			return nil, err
		}
	}
	if err := m.installRules(); err != nil {
		h.Close()
		return nil, err
	}
	if err := m.installRangeRoute(); err != nil {
		_ = m.removeRules()
		h.Close()
		return nil, err
	}
	m.warnLocalResolvers()
	if err := m.local.start(); err != nil {
		// Refused then asks the kernel every time.
		slog.Warn("network: no route subscription: every address check goes to the kernel", "err", err)
	}
	if cfg.PoolSize > 0 {
		m.active.Add(1)
		go m.fill()
		m.kick()
	}
	return m, nil
}

// Acquire returns a ready slot: a pooled one when the pool has one (and the
// filler then builds its replacement), else one built now (a few ms; ctx
// is checked before, the build itself is not interrupted).
func (m *Manager) Acquire(ctx context.Context) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for {
		var s *Slot
		select {
		case s = <-m.pool:
		default:
		}
		if s == nil {
			break
		}
		m.kick()
		if m.transition(s, statePooled, stateOut) {
			return s, nil
		}
		// No longer pooled (cannot normally happen): take the next one.
	}
	if err := m.begin(); err != nil {
		return nil, err
	}
	defer m.active.Done()
	m.kick()
	s, err := m.create(stateOut)
	if err != nil {
		return nil, err
	}
	if m.isClosed() {
		// Close may already have decided about the tables; don't hand
		// out a slot it did not account for.
		return nil, errors.Join(ErrClosed, m.Release(s))
	}
	return s, nil
}

// Release tears a slot from Acquire or Adopt down: when it returns, the
// veth pair, the pin and the namespace file are gone. Its /30 is reused
// once conntrack has forgotten the sandbox's flows. Release takes the very
// *Slot that was handed out: releasing one twice, or a copy, does nothing,
// so a stale handle can never tear down the next holder of the /30.
func (m *Manager) Release(s *Slot) error {
	if s == nil {
		return nil
	}
	m.mu.Lock()
	e := m.ids[s.ID]
	if e == nil || e.slot != s || (e.state != stateOut && e.state != statePooled) {
		m.mu.Unlock()
		return nil
	}
	e.state = stateBusy
	m.mu.Unlock()
	err := errors.Join(m.clearPolicy(s), m.teardown(s))
	m.mu.Lock()
	if err != nil {
		// Something of it may remain: keep its /30 out of use and leave
		// it to Cleanup, like a leftover.
		e.state, e.slot = stateLeftover, nil
	} else {
		e.state, e.slot = stateDirty, nil
	}
	m.mu.Unlock()
	m.kick() // the filler may have stopped on an exhausted range
	if err != nil {
		return fmt.Errorf("network: releasing %s: %w", s.Name, err)
	}
	return nil
}

// Close stops the filler and tears down the pooled slots. It removes the
// nftables tables unless slots of this manager are still out: their
// sandboxes may outlive this process and must stay isolated (use Destroy
// to remove the tables regardless). Slots that are out stay as they are.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	m.local.close()
	m.active.Wait() // no build is in flight after this
	var errs []error
	for drained := false; !drained; {
		select {
		case s := <-m.pool:
			errs = append(errs, m.Release(s))
		default:
			drained = true
		}
	}
	if !m.anyInUse() {
		errs = append(errs, m.removeRules(), m.removeRangeRoute())
	}
	return errors.Join(errs...)
}

// Destroy closes the manager and removes its nftables tables even if
// slots are still out (tests, uninstall).
// The manager must not be used afterwards.
func (m *Manager) Destroy() error {
	err := errors.Join(m.Close(), m.removeRules(), m.removeRangeRoute())
	m.nl.Close()
	return err
}

// IsPooled reports whether the namespace name belongs to a ready slot
// waiting in the pool.
func (m *Manager) IsPooled(name string) bool {
	id, ok := m.cfg.parseID(name, "-")
	if !ok {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.ids[id]
	return e != nil && e.state == statePooled
}

// warnLocalResolvers logs resolvers that are addresses of this host:
// sandboxes never reach the host, so they cannot use them.
func (m *Manager) warnLocalResolvers() {
	addrs, err := whole(func() ([]netlink.Addr, error) { return m.nl.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return
	}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		if slices.Contains(m.cfg.Resolvers, ip) {
			slog.Warn("network: a resolver is an address of this host, which sandboxes cannot reach: they get no DNS from it",
				"resolver", ip, "interface", a.Label)
		}
	}
}

// begin registers an inline build, unless the manager is closed.
func (m *Manager) begin() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.active.Add(1)
	return nil
}

func (m *Manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// anyInUse reports whether any slot of ours may still have a sandbox in it.
func (m *Manager) anyInUse() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.ids {
		if e.state != stateDirty {
			return true
		}
	}
	return false
}
