package network

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
)

// state is where an id (and so its /30 and names) stands. An id that is
// not in Manager.ids is free.
type state uint8

const (
	stateBusy     state = iota // being built or torn down by one goroutine
	statePooled                // built, waiting in the pool
	stateOut                   // handed out by Acquire or Adopt
	stateLeftover              // names taken by something we did not make (or failed to remove): skipped until Cleanup
	stateDirty                 // torn down, but conntrack may still hold its flows: free after the next flush
)

type entry struct {
	state state
	slot  *Slot // nil unless pooled or out
}

// create reserves a free id, builds its slot and records it in state final.
// Ids whose names turn out to be taken by leftovers are marked and stepped
// over.
func (m *Manager) create(final state) (*Slot, error) {
	for {
		id, err := m.reserve()
		if errors.Is(err, errNeedFlush) {
			if err := m.flushDirty(); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		s := m.cfg.slot(id)
		if taken, err := m.namesTaken(s); err != nil || taken {
			m.setState(id, stateLeftover, nil)
			if err != nil {
				return nil, err
			}
			continue
		}
		if err := m.build(s); err != nil {
			// build removed what it made; a name taken between the check
			// and the build is somebody else's, so remember it.
			if errors.Is(err, os.ErrExist) {
				m.setState(id, stateLeftover, nil)
			} else {
				m.free(id)
			}
			return nil, fmt.Errorf("network: building slot %s: %w", s.Name, err)
		}
		m.setState(id, final, s)
		return s, nil
	}
}

// errNeedFlush: no id is free, but dirty ones can be freed by a flush.
var errNeedFlush = errors.New("network: dirty slots need a conntrack flush")

// reserve marks the first free id at or after next as busy. Searching from
// where the last search stopped, rather than from 0, delays the reuse of a
// just-released /30 as long as possible, which lets released ids gather as
// dirty until one conntrack flush frees them all.
func (m *Manager) reserve() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	n := m.cfg.slotCount()
	dirty := false
	for i := 0; i < n; i++ {
		id := (m.next + i) % n
		e, taken := m.ids[id]
		if !taken {
			m.ids[id] = &entry{state: stateBusy}
			m.next = (id + 1) % n
			return id, nil
		}
		dirty = dirty || e.state == stateDirty
	}
	if dirty {
		return 0, errNeedFlush
	}
	return 0, fmt.Errorf("%w: all %d /%d of %s are in use", ErrExhausted, n, slotBits, m.cfg.CIDR)
}

// namesTaken reports whether the slot's namespace or veth exists already.
func (m *Manager) namesTaken(s *Slot) (bool, error) {
	if _, err := os.Lstat(s.NetNSPath); err == nil {
		return true, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	_, err := m.nl.LinkByName(s.HostVeth)
	if err == nil {
		return true, nil
	}
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return false, nil
	}
	return false, fmt.Errorf("network: looking up %s: %w", s.HostVeth, err)
}

func (m *Manager) setState(id int, st state, s *Slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ids[id] = &entry{state: st, slot: s}
}

func (m *Manager) free(id int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.ids, id)
}

// transition moves s from one state to another if it is still in the first.
func (m *Manager) transition(s *Slot, from, to state) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.ids[s.ID]
	if e == nil || e.slot != s || e.state != from {
		return false
	}
	e.state = to
	return true
}
