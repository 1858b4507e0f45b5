package setup

import (
	"bytes"
	"io"
	"sync"
)

// syncWriter serialises writes from the steps that run side by side.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// lines returns a writer for one step that passes on only whole lines, so
// that two steps' output (a build tool writes in arbitrary chunks) never
// mixes within a line.
func (s *syncWriter) lines() *lineWriter { return &lineWriter{out: s} }

type lineWriter struct {
	mu  sync.Mutex
	out *syncWriter
	buf []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if i := bytes.LastIndexByte(l.buf, '\n'); i >= 0 {
		if _, err := l.out.Write(l.buf[:i+1]); err != nil {
			return 0, err
		}
		l.buf = append(l.buf[:0], l.buf[i+1:]...)
	}
	return len(p), nil
}

// Flush writes a last, unterminated line.
func (l *lineWriter) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.out.Write(append(l.buf, '\n'))
		l.buf = l.buf[:0]
	}
}
