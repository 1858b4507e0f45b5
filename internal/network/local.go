package network

import (
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
)

// localAnswers keeps the kernel's answers to "is this address the host's
// own" (Manager.isLocal) until the host's routes change. The egress proxy
// asks it of every connection's destination and of every address it
// dials, and each kernel answer is a netlink round trip on the one socket
// the manager shares (tens of microseconds on a busy node, more when
// callers queue for the socket).
//
// Every route change in the host's namespace clears it: an address the
// host gains or loses comes with a route in the local table, so the next
// question after its event goes to the kernel again. An answer the kernel
// gave before a change is not kept if the change's event came while it
// was asked (gen). Until the subscription runs, and for good once it
// fails or ends, nothing is kept and every question goes to the kernel.
type localAnswers struct {
	mu      sync.Mutex
	live    bool
	gen     uint64 // bumped by every clear
	answers map[netip.Addr]bool
	done    chan struct{}
}

// maxLocalAnswers bounds the map; past it, it starts over.
const maxLocalAnswers = 4096

// start subscribes to the route changes of the calling thread's network
// namespace (the host's, where the manager's handle is).
func (l *localAnswers) start() error {
	updates := make(chan netlink.RouteUpdate, 64)
	l.done = make(chan struct{})
	err := netlink.RouteSubscribeWithOptions(updates, l.done, netlink.RouteSubscribeOptions{
		ErrorCallback: func(error) { l.stop() },
	})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.live = true
	l.mu.Unlock()
	go func() {
		for range updates {
			l.clear()
		}
		// The subscription ended (closed, or its socket failed).
		l.stop()
	}()
	return nil
}

// close ends the subscription; answers are no longer kept.
func (l *localAnswers) close() {
	l.stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done != nil {
		close(l.done)
		l.done = nil
	}
}

func (l *localAnswers) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live = false
	l.gen++
	l.answers = nil
}

func (l *localAnswers) clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	l.answers = nil
}

// get returns a kept answer, or the generation to pass to put with the
// kernel's.
func (l *localAnswers) get(a netip.Addr) (local, ok bool, gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	local, ok = l.answers[a]
	return local, ok && l.live, l.gen
}

// put keeps the kernel's answer for a, asked at generation gen, unless the
// routes changed since.
func (l *localAnswers) put(a netip.Addr, local bool, gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.live || gen != l.gen {
		return
	}
	if l.answers == nil || len(l.answers) >= maxLocalAnswers {
		l.answers = map[netip.Addr]bool{}
	}
	l.answers[a] = local
}
