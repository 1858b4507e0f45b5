package proxy

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
)

// An upstream may answer a request before it has read the request's body
// and close the connection (an app refusing a method or an upload, or a
// node passing such an answer on and closing as duplex.go does). The
// transport is then still writing the body, and the peer's reset fails
// that write. net/http's transport returns whichever it meets first, the
// write's error or the answer: a client got a 502 for an answer that had
// arrived (an api forwarding a POST to an early-answering app, about one
// request in twenty on a busy machine).
//
// answerFirstConn makes the answer win: a write the peer refused (EPIPE,
// ECONNRESET) is reported as done and later writes are dropped, so the
// transport goes on to read. The answer the peer sent before its reset is
// still there to read; if there is none, the read fails, and the request
// with it, as the write would have made it. (Not only after the first
// byte read: the reset can come before the transport's reader has taken
// the answer from the socket.)
type answerFirstConn struct {
	net.Conn
	refused atomic.Bool // a write was refused: later ones are dropped
}

func (c *answerFirstConn) Write(p []byte) (int, error) {
	if c.refused.Load() {
		return len(p), nil
	}
	n, err := c.Conn.Write(p)
	if err != nil && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		c.refused.Store(true)
		return len(p), nil
	}
	return n, err
}

// dialAnswerFirst is dial with its connections wrapped in
// answerFirstConn.
func dialAnswerFirst(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &answerFirstConn{Conn: c}, nil
	}
}
