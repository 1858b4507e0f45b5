package testhost

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/lockfile"
)

// LockWait bounds how long Open waits for another test host with the same
// name or address to close; then Open fails and says who holds it.
const LockWait = 5 * time.Minute

// lockDir holds the lock files; flock(2) locks go with the process that
// holds them, so a killed test leaves no stale lock.
var lockDir = "/run/lock"

// lockPaths are the lock files of a test host's name and address.
func lockPaths(name string, addr netip.Addr) []string {
	return []string{
		filepath.Join(lockDir, "warren-testhost-name-"+name+".lock"),
		filepath.Join(lockDir, "warren-testhost-"+addr.String()+".lock"),
	}
}

// lock takes the name's lock, then the address's, waiting at most wait for
// both, and writes who holds them into the files for the message of the
// next waiter.
func lock(name string, addr netip.Addr, wait time.Duration) (unlock func(), err error) {
	if err := os.MkdirAll(lockDir, 0o1777); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var releases []func()
	unlock = func() {
		for i := len(releases) - 1; i >= 0; i-- {
			releases[i]()
		}
	}
	holder := fmt.Sprintf("pid %d (%s), test host %s at %s\n", os.Getpid(), filepath.Base(os.Args[0]), name, addr)
	for _, p := range lockPaths(name, addr) {
		release, err := lockfile.Acquire(ctx, p)
		if errors.Is(err, context.DeadlineExceeded) {
			unlock()
			return nil, fmt.Errorf("testhost %s: %s is still held after %s by %s: another test uses the same test host name or address",
				name, p, wait.Round(time.Millisecond), holderOf(p))
		}
		if err != nil {
			unlock()
			return nil, fmt.Errorf("testhost %s: %w", name, err)
		}
		releases = append(releases, release)
		_ = os.WriteFile(p, []byte(holder), 0o644) // only for the message above
	}
	return unlock, nil
}

func holderOf(path string) string {
	b, err := os.ReadFile(path)
	if s := strings.TrimSpace(string(b)); err == nil && s != "" {
		return s
	}
	return "an unknown process"
}

// lockWaitFor is LockWait, cut short to end a minute before the test's
// deadline (go test -timeout) so that the test fails with the reason
// rather than the binary with a timeout panic.
func lockWaitFor(t testing.TB) time.Duration {
	d, ok := t.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return LockWait
	}
	deadline, ok := d.Deadline()
	if !ok {
		return LockWait
	}
	return max(min(LockWait, time.Until(deadline)-time.Minute), time.Second)
}
