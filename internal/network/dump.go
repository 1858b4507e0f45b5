package network

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// dumpAttempts bounds how often a netlink dump is read again after the
// kernel said it was interrupted.
const dumpAttempts = 10

// whole reads a netlink dump (links, addresses, routes) until the kernel
// reports it consistent. A dump is interrupted when the table changes
// while it is read, which is routine on a host where sandboxes' veths and
// routes come and go (and other servers' too); the partial list it
// returns could miss a link of ours or one that conflicts.
func whole[T any](dump func() ([]T, error)) ([]T, error) {
	var (
		out []T
		err error
	)
	for range dumpAttempts {
		out, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return out, err
}

// deleteFlows deletes the conntrack flows filter matches. Conntrack's
// dump is interrupted as the table changes under it (every connection of
// every sandbox changes it); netlink then deletes what it saw, and the
// flows it did not see are sought again.
func (m *Manager) deleteFlows(filter netlink.CustomConntrackFilter) error {
	var err error
	for range dumpAttempts {
		_, err = m.nl.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.FAMILY_V4, filter)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return err
}
