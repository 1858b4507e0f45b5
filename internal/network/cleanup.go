package network

import (
	"errors"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// Cleanup removes slots with this manager's prefix that known (given the
// namespace name) does not claim: what a crashed run left behind, including
// its pooled slots. This manager's own pooled slots and slots being built
// are kept; slots it handed out are kept only if known claims them.
func (m *Manager) Cleanup(known func(name string) bool) error {
	m.mu.Lock()
	ours := map[int]bool{}
	for id := range m.used {
		if !m.out[id] {
			ours[id] = true
		}
	}
	m.mu.Unlock()
	ids := map[int]bool{}
	if entries, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range entries {
			if id, ok := m.parseID(e.Name(), m.cfg.Prefix+"-"); ok {
				ids[id] = true
			}
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if id, ok := m.parseID(l.Attrs().Name, m.cfg.Prefix+"v"); ok {
			ids[id] = true
		}
	}
	var errs []error
	for id := range ids {
		if ours[id] || (known != nil && known(m.nsName(id))) {
			continue
		}
		errs = append(errs, m.teardown(m.slot(id)))
		m.mu.Lock()
		delete(m.used, id)
		delete(m.out, id)
		m.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (m *Manager) parseID(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	id, err := strconv.Atoi(rest)
	if err != nil || id < 0 || id >= m.max || strconv.Itoa(id) != rest {
		return 0, false
	}
	return id, true
}

// Adopt marks a slot of a previous run, still used by a running sandbox,
// as in use, so its subnet is not handed out again. It returns the slot.
func (m *Manager) Adopt(name string) (*Slot, bool) {
	id, ok := m.parseID(name, m.cfg.Prefix+"-")
	if !ok {
		return nil, false
	}
	s := m.slot(id)
	if _, err := os.Stat(s.NetNSPath); err != nil {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, taken := m.used[id]; taken {
		return nil, false
	}
	m.used[id] = s
	m.out[id] = true
	return s, true
}
