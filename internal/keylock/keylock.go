// Package keylock serialises work by key: at most one holder of a key at
// a time (one fetch or pull of an image, say), while work on other keys
// goes on. A key's entry lives only while someone holds or waits for it,
// so that keys used once (build and image IDs) do not pile up.
package keylock

import "sync"

// Locks is a set of locks by key. The zero value is ready to use; it must
// not be copied after first use.
type Locks struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int // holders and waiters; guarded by Locks.mu
}

// Lock waits until key is free, takes it, and returns the function that
// frees it (to be called once).
func (l *Locks) Lock(key string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*entry{}
	}
	e := l.m[key]
	if e == nil {
		e = &entry{}
		l.m[key] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
}

// held is how many keys have an entry (for tests).
func (l *Locks) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
