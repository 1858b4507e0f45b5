package dispatch

import (
	"cmp"
	"slices"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// nominalSandboxMB sizes a node's capacity in sandboxes when it sets no
// --max-sandboxes: a default sandbox's memory.
const nominalSandboxMB = 512

// order returns the nodes a new sandbox may go to, best first: ready (not
// cordoned or draining), heard from within lostAfter, with an internal
// address, and below their sandbox limit. The least loaded comes first,
// load being the share of its capacity in sandboxes that it holds, with
// pending (creates under way, and those placed less those freed since its
// last heartbeat) added to what its heartbeat said; ties go to the node with more free memory,
// then by name. Spreading by load is what keeps one node from taking a
// burst alone while its heartbeat lags.
//
// Locality is the caller's: Create puts first the node that built the
// template, then those with a warm sandbox of it.
func order(nodes []store.Node, now time.Time, lostAfter time.Duration, pending func(store.Node) int) []store.Node {
	type cand struct {
		n      store.Node
		load   float64
		freeMB int
	}
	var cs []cand
	for _, n := range nodes {
		if n.State != store.NodeReady || n.Address == "" || n.Lost(now, lostAfter) {
			continue
		}
		held := max(n.Sandboxes+pending(n), 0)
		capacity := n.MaxSandboxes
		if capacity <= 0 {
			capacity = max(n.MemoryMB/nominalSandboxMB, 1)
		}
		if n.MaxSandboxes > 0 && held >= n.MaxSandboxes {
			continue
		}
		cs = append(cs, cand{n: n, load: float64(held) / float64(capacity), freeMB: n.MemoryMB - n.UsedMemoryMB})
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if c := cmp.Compare(a.load, b.load); c != 0 {
			return c
		}
		if c := cmp.Compare(b.freeMB, a.freeMB); c != 0 {
			return c
		}
		return cmp.Compare(a.n.Name, b.n.Name)
	})
	out := make([]store.Node, len(cs))
	for i, c := range cs {
		out[i] = c.n
	}
	return out
}
