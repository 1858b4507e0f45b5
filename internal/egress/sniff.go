package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// Kind is what a connection's first bytes turned out to be.
type Kind string

const (
	KindTLS   Kind = "tls"
	KindHTTP  Kind = "http"
	KindOther Kind = "tcp"
)

// maxSniff bounds what is read before a decision: a ClientHello is at
// most a few KiB, an HTTP request head rarely more than 8 KiB.
const maxSniff = 32 << 10

// sniffResult is what sniff read.
type sniffResult struct {
	kind Kind
	host string // the SNI or Host as sent ("" if none)
	data []byte // every byte read, to be replayed upstream
}

// sniff reads the first bytes of c until it can tell a TLS ClientHello
// (and its SNI) or an HTTP request head (and its Host) from anything
// else, at most maxSniff bytes, until c's read deadline. An error is
// returned only when nothing at all was read.
func sniff(c net.Conn) (sniffResult, error) {
	rec := &recorder{r: c}
	first := make([]byte, 1)
	if _, err := io.ReadFull(rec, first); err != nil {
		return sniffResult{kind: KindOther, data: rec.buf.Bytes()}, err
	}
	switch {
	case first[0] == 0x16: // a TLS handshake record
		host, ok := readClientHello(rec)
		if ok {
			return sniffResult{kind: KindTLS, host: host, data: rec.buf.Bytes()}, nil
		}
	case first[0] >= 'A' && first[0] <= 'Z':
		if host, ok := readHTTPHead(rec); ok {
			return sniffResult{kind: KindHTTP, host: host, data: rec.buf.Bytes()}, nil
		}
	}
	return sniffResult{kind: KindOther, data: rec.buf.Bytes()}, nil
}

// recorder reads from r and keeps a copy of everything, at most maxSniff
// bytes.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

var errTooLong = errors.New("egress: first bytes too long to sniff")

func (r *recorder) Read(p []byte) (int, error) {
	if room := maxSniff - r.buf.Len(); room <= 0 {
		return 0, errTooLong
	} else if len(p) > room {
		p = p[:room]
	}
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// readClientHello lets crypto/tls parse the ClientHello (it reassembles
// fragmented records) and stops the handshake there.
func readClientHello(rec *recorder) (string, bool) {
	var host string
	var seen bool
	errDone := errors.New("done")
	conn := &replayConn{r: io.MultiReader(bytes.NewReader(rec.buf.Bytes()), rec)}
	srv := tls.Server(conn, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		host, seen = h.ServerName, true
		return nil, errDone
	}})
	_ = srv.Handshake()
	return host, seen
}

// readHTTPHead reads up to the end of an HTTP/1 request head and returns
// its Host (of an absolute request target, else of the header).
func readHTTPHead(rec *recorder) (string, bool) {
	for !bytes.Contains(rec.buf.Bytes(), []byte("\r\n\r\n")) {
		chunk := make([]byte, 4096)
		if _, err := rec.Read(chunk); err != nil {
			return "", false
		}
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(rec.buf.Bytes())))
	if err != nil {
		return "", false
	}
	return req.Host, true
}

// replayConn is a read-only net.Conn over r, for crypto/tls to parse a
// ClientHello from; writes fail, which ends the handshake.
type replayConn struct {
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *replayConn) Write(p []byte) (int, error)      { return 0, errors.New("read-only") }
func (c *replayConn) Close() error                     { return nil }
func (c *replayConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *replayConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *replayConn) SetDeadline(time.Time) error      { return nil }
func (c *replayConn) SetReadDeadline(time.Time) error  { return nil }
func (c *replayConn) SetWriteDeadline(time.Time) error { return nil }

// prefixConn is a connection whose first reads return prefix: the bytes
// sniff consumed, handed back to whoever reads the connection next.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
