package testenv

import (
	"bytes"
	"sync"
)

// Buffer is a bytes buffer safe for concurrent use: the code under test
// writes to it (a logger, a process's output) from its own goroutines
// while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
