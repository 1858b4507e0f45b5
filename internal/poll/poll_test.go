package poll

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestUntilDone(t *testing.T) {
	calls := 0
	err := Until(context.Background(), time.Millisecond, func(context.Context) (bool, error) {
		calls++
		return calls == 3, nil
	})
	if err != nil || calls != 3 {
		t.Errorf("err %v after %d calls, want nil after 3", err, calls)
	}
}

func TestUntilError(t *testing.T) {
	boom := errors.New("boom")
	calls := 0
	err := Until(context.Background(), time.Millisecond, func(context.Context) (bool, error) {
		calls++
		return false, boom
	})
	if !errors.Is(err, boom) || calls != 1 {
		t.Errorf("err %v after %d calls, want boom after 1", err, calls)
	}
}

func TestUntilContextEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	calls := 0
	err := Until(ctx, time.Millisecond, func(context.Context) (bool, error) {
		calls++
		return false, nil
	})
	if !errors.Is(err, context.DeadlineExceeded) || calls < 2 {
		t.Errorf("err %v after %d calls, want the deadline after several", err, calls)
	}
	// An ended context still gets one try: a condition that already holds
	// is not reported as a timeout.
	if err := Until(ctx, time.Millisecond, func(context.Context) (bool, error) { return true, nil }); err != nil {
		t.Errorf("done at once under an ended context: %v", err)
	}
}

func TestBackoffIntervals(t *testing.T) {
	var times []time.Time
	err := Backoff(context.Background(), time.Millisecond, 4*time.Millisecond, func(context.Context) (bool, error) {
		times = append(times, time.Now())
		return len(times) == 5, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// At least 1, 2, 4, 4 ms apart (timers never fire early).
	for i, want := range []time.Duration{1, 2, 4, 4} {
		if got := times[i+1].Sub(times[i]); got < want*time.Millisecond {
			t.Errorf("wait %d: %v, want at least %v ms", i+1, got, int(want))
		}
	}
}

func TestWithin(t *testing.T) {
	calls := 0
	if !Within(time.Second, time.Millisecond, func() bool { calls++; return calls == 3 }) || calls != 3 {
		t.Errorf("Within: %d calls, want true after 3", calls)
	}
	calls = 0
	if Within(10*time.Millisecond, time.Millisecond, func() bool { calls++; return false }) || calls < 2 {
		t.Errorf("Within of a condition that never holds: %d calls, want false after several", calls)
	}
}
