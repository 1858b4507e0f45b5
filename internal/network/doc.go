// Package network gives every sandbox a network of its own, called a slot,
// and keeps sandboxes away from the host and from each other.
//
// # Terms
//
//   - Slot: one sandbox's network. It is a named network namespace, pinned
//     by a bind mount at /var/run/netns/<prefix>-<id> as `ip netns add`
//     does, so that OCI runtimes can join it by path; a veth pair whose host
//     end <prefix>v<id> stays in the root namespace and whose other end is
//     eth0 inside the slot; and the id-th /30 of the configured range. The
//     host end has the /30's first usable address (HostIP), eth0 the second
//     (SandboxIP); inside, lo is up and the default route points at HostIP.
//   - Id: the index of a slot's /30 in the range. It alone determines the
//     slot's names and addresses, so a restarted process can tell its own
//     leftovers from anybody else's by name.
//   - Pool: slots built ahead of time by a background filler, so a sandbox
//     create takes a ready slot instead of paying for building one.
//   - Leftover: a namespace or veth with this manager's prefix that the
//     manager did not make, typically from a previous run that crashed.
//     The allocator steps over them and Cleanup removes them.
//   - Tables: Warren's nftables tables, "warren_<prefix>" (inet, filters,
//     and the sets "blocked" and "resolvers" of the egress policy) and
//     "warren_<prefix>_nat" (ip, egress masquerade). Nothing else in the
//     host's ruleset is read or changed.
//
// # Lifecycle
//
// New installs the tables (replacing ours from an earlier run in one atomic
// batch, so running sandboxes are never unprotected) and starts the filler.
//
// A slot's states are:
//
//	free --> building --(filler)--> pooled --Acquire--> out --Release--> dirty --(flush)--> free
//	         building --(Acquire, pool empty)---------> out
//
// Acquire takes a pooled slot when there is one and asks the filler for a
// replacement; otherwise it builds one inline. Release tears a handed-out
// slot down completely (veth pair, pin, namespace) before it returns: a
// used namespace may carry whatever the sandbox did to it, so slots are
// never recycled. The released /30 is "dirty" until conntrack has forgotten
// its flows (see conntrack.go); it is reused only after that. A slot whose
// build fails half-way is undone before the error is returned.
//
// Close stops the filler and tears down the pool. It removes the tables
// too, unless slots of this manager are still out: sandboxes that outlive
// the control plane (a restart) must stay isolated, and the next New
// reinstalls the same rules anyway. Destroy always removes the tables.
// Cleanup, meant for start-up after a crash, removes leftovers and slots
// that the caller's known function does not claim; Adopt takes back a slot
// that a still-running sandbox of the previous run uses.
//
// # Isolation
//
// Packets from a slot's veth that are addressed to the host itself (any of
// its addresses) are refused (TCP reset, else ICMP admin-prohibited) unless
// they answer a connection the host opened: the platform dials into
// sandboxes, sandboxes never reach host services. Packets from one slot to
// another are refused the same way, and IPv6 from slots is dropped (slots
// are IPv4-only). Packets whose source address does not belong to the slot
// they came from are dropped before conntrack sees them, so a sandbox can
// neither pose as another nor leak spoofed traffic. A new connection from a
// slot to a host address is refused before the host's own port forwards
// (DNAT) could send it elsewhere. The range itself has an unreachable route
// (route.go), below each slot's own /30: the host's packets to a released
// address fail at once instead of leaving through the default route.
//
// The egress policy (egress.go) comes after those rules: destinations in
// BlockedRanges (private, CGNAT, link-local, loopback, multicast, reserved)
// are refused with a TCP reset or an ICMP "administratively prohibited",
// except ranges in Config.AllowPrivate and port 53 of Config.Resolvers.
// Other traffic is forwarded and leaves through the uplink (the interface
// of the default route) with its source masqueraded.
//
// Each slot may have Config.MaxConns connections open and open
// Config.ConnRate new ones a second (limits.go): one sandbox cannot fill
// the host's conntrack table.
package network
