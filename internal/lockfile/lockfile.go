// Package lockfile serialises work between processes with flock(2), e.g.
// two `warren setup` runs building the same runtime or base image.
package lockfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// pollInterval is how often a waiter retries: flock has no timeout, so it
// is polled without blocking to let ctx end the wait.
const pollInterval = 200 * time.Millisecond

// Acquire takes an exclusive lock on path (created if missing), waiting
// until it is free or ctx is done. release gives it back.
func Acquire(ctx context.Context, path string) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for %s: %w", path, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}
