// Package poll waits for a condition by asking again: envd answering its
// health check, a lock coming free, a cgroup emptying, a build ending. One
// loop, so that every wait ends the same way when its context does, and
// an interval runs from the end of one try to the start of the next (a
// slow try never makes the next one come sooner).
package poll

import (
	"context"
	"time"
)

// Until calls cond at once and then every interval until it reports done
// or an error, or ctx ends. It returns cond's error, or ctx.Err() if ctx
// ended first (cond is not called again once ctx has ended).
func Until(ctx context.Context, interval time.Duration, cond func(context.Context) (done bool, err error)) error {
	return Backoff(ctx, interval, interval, cond)
}

// Backoff is Until with a growing interval: first after the first try,
// then twice the last, at most max.
func Backoff(ctx context.Context, first, max time.Duration, cond func(context.Context) (done bool, err error)) error {
	for delay := first; ; delay = min(2*delay, max) {
		done, err := cond(ctx)
		if done || err != nil {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Within calls cond at once and then every interval until it returns true
// or d has passed since the call, and reports whether it did. cond is
// always tried once more after the last wait, even if that wait ended
// past d. It is for waits bounded by time rather than a context, as in
// tests.
func Within(d, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}
