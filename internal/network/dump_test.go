package network

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestWholeRereadsAnInterruptedDump(t *testing.T) {
	calls := 0
	got, err := whole(func() ([]int, error) {
		calls++
		if calls < 3 {
			return []int{calls}, netlink.ErrDumpInterrupted // partial
		}
		return []int{1, 2, 3}, nil
	})
	if err != nil || len(got) != 3 || calls != 3 {
		t.Fatalf("got %v, %v after %d reads; want the third, whole read", got, err, calls)
	}

	calls = 0
	_, err = whole(func() ([]int, error) {
		calls++
		return nil, netlink.ErrDumpInterrupted
	})
	if !errors.Is(err, netlink.ErrDumpInterrupted) || calls != dumpAttempts {
		t.Fatalf("a dump interrupted every time: %v after %d reads; want the error after %d", err, calls, dumpAttempts)
	}

	calls = 0
	other := errors.New("permission denied")
	if _, err = whole(func() ([]int, error) { calls++; return nil, other }); err != other || calls != 1 {
		t.Fatalf("another error: %v after %d reads; want it at once", err, calls)
	}
}
