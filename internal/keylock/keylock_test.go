package keylock

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestOneHolderPerKey(t *testing.T) {
	var l Locks
	var in, most atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock := l.Lock("a")
			n := in.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(time.Millisecond)
			in.Add(-1)
			unlock()
		}()
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("%d holders of one key at once", most.Load())
	}
	if n := l.held(); n != 0 {
		t.Errorf("%d entries left once every holder let go", n)
	}
}

func TestOtherKeysGoOn(t *testing.T) {
	var l Locks
	unlock := l.Lock("a")
	defer unlock()
	done := make(chan struct{})
	go func() { l.Lock("b")(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a lock of b waited for a's holder")
	}
}
