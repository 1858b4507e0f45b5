package network

import (
	"errors"
	"log/slog"
	"time"
)

// retryAfter is how long the filler waits after a failed build before it
// tries again by itself (an Acquire wakes it sooner).
const retryAfter = time.Second

// kick wakes the filler; it never blocks.
func (m *Manager) kick() {
	select {
	case m.refill <- struct{}{}:
	default:
	}
}

// fill keeps the pool full until Close. Builds run one at a time: the pool
// only has to keep ahead of sandbox creates, and a burst larger than the
// pool builds inline in the callers' goroutines.
func (m *Manager) fill() {
	defer m.active.Done()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-m.refill:
		case <-retry.C:
		}
		for len(m.pool) < cap(m.pool) {
			select {
			case <-m.stop:
				return
			default:
			}
			s, err := m.create(statePooled)
			if err != nil {
				// Exhausted: Release frees ids and the next Acquire kicks us.
				if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrExhausted) {
					slog.Warn("network: refilling the slot pool", "err", err)
					retry.Reset(retryAfter)
				}
				break
			}
			m.pool <- s // cannot block: only this goroutine sends, and there was room
		}
	}
}
