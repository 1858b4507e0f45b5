// Package lockfile serialises work between processes with flock(2), e.g.
// two `warren setup` runs building the same runtime or base image.
package lockfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
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
	err = poll.Until(ctx, pollInterval, func(context.Context) (bool, error) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return err == nil, err
	})
	switch {
	case err == nil:
		return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		f.Close()
		return nil, fmt.Errorf("waiting for %s: %w", path, err)
	default:
		f.Close()
		return nil, err
	}
}
