package network

import (
	"errors"
	"fmt"
	"os"
)

// Cleanup removes namespaces and veths with this manager's prefix that
// known (given a namespace name) does not claim: what a crashed run left,
// including its pool, and slots of this run the caller no longer tracks.
// Slots this manager is building or holds in its pool are never touched.
// Claimed leftovers are kept and their /30s stay reserved, so they are not
// handed out twice; Adopt turns one into a slot that can be released.
// A nil known claims nothing.
func (m *Manager) Cleanup(known func(name string) bool) error {
	found, err := m.onHost()
	if err != nil {
		return err
	}
	var errs []error
	for id := range found {
		m.mu.Lock()
		before := m.ids[id]
		var st state
		if before != nil {
			st = before.state
		}
		m.mu.Unlock()
		if before != nil && (st == stateBusy || st == statePooled) {
			continue
		}
		// known is the caller's code: call it without our lock held.
		if known != nil && known(m.cfg.nsName(id)) {
			if before == nil {
				m.reserveIfFree(id, stateLeftover)
			}
			continue
		}
		if !m.takeFor(id, before, st) {
			continue // changed meanwhile; the next Cleanup will see
		}
		if err := errors.Join(m.clearPolicy(m.cfg.slot(id)), m.teardown(m.cfg.slot(id))); err != nil {
			m.setState(id, stateLeftover, nil)
			errs = append(errs, fmt.Errorf("network: removing leftover %s: %w", m.cfg.nsName(id), err))
			continue
		}
		m.setState(id, stateDirty, nil)
	}
	// Leftovers that have vanished by other means free their /30s, after
	// a flush like any released slot.
	m.mu.Lock()
	for id, e := range m.ids {
		if e.state == stateLeftover && !found[id] {
			e.state = stateDirty
		}
	}
	m.mu.Unlock()
	return errors.Join(errs...)
}

// onHost lists the ids that have a namespace file or a veth on the host.
func (m *Manager) onHost() (map[int]bool, error) {
	found := map[int]bool{}
	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("network: %w", err)
	}
	for _, e := range entries {
		if id, ok := m.cfg.parseID(e.Name(), "-"); ok {
			found[id] = true
		}
	}
	links, err := whole(m.nl.LinkList)
	if err != nil {
		return nil, fmt.Errorf("network: listing links: %w", err)
	}
	for _, l := range links {
		if id, ok := m.cfg.parseID(l.Attrs().Name, "v"); ok {
			found[id] = true
		}
	}
	return found, nil
}

// takeFor marks id busy for removal if its entry is still the one seen.
func (m *Manager) takeFor(id int, seen *entry, st state) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.ids[id]
	if cur != seen || (cur != nil && cur.state != st) {
		return false
	}
	m.ids[id] = &entry{state: stateBusy}
	return true
}

func (m *Manager) reserveIfFree(id int, st state) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, taken := m.ids[id]; !taken {
		m.ids[id] = &entry{state: st}
	}
}

// Adopt takes over the slot named name, left by a previous run and still
// used by a running sandbox, so that it can be released later. It reports
// false if the name is not one of this manager's, its namespace does not
// exist, or the slot is already in use in this run.
func (m *Manager) Adopt(name string) (*Slot, bool) {
	id, ok := m.cfg.parseID(name, "-")
	if !ok {
		return nil, false
	}
	s := m.cfg.slot(id)
	if _, err := os.Stat(s.NetNSPath); err != nil {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.ids[id]; e != nil && e.state != stateLeftover {
		return nil, false
	}
	m.ids[id] = &entry{state: stateOut, slot: s}
	return s, true
}
