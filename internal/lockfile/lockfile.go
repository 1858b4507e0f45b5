// Package lockfile serialises work between processes with flock(2), e.g.
// two `warren setup` runs building the same runtime or base image, and
// keeps two `warren serve` from claiming the same host resources.
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

// ErrHeld is TryAcquire's error when another process holds the lock.
var ErrHeld = errors.New("held by another process")

// TryAcquire takes an exclusive lock on path (created 0600 if missing)
// without waiting, and records owner in the file for whoever finds it
// taken. holder is what the file recorded before: the holder's record
// when another process holds it (the error then wraps ErrHeld), the last
// holder's when the lock was free. release gives the lock back; the file
// and its record stay (removing it would let a third process lock a new
// file while a second still holds the old one).
func TryAcquire(path, owner string) (release func(), holder string, err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, "", err
	}
	record := func() string {
		b := make([]byte, 512)
		n, _ := f.ReadAt(b, 0)
		return string(b[:n])
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, record(), fmt.Errorf("%s: %w", path, ErrHeld)
		}
		return nil, "", err
	}
	holder = record()
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(owner), 0)
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, holder, nil
}
