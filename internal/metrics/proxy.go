package metrics

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Proxy wraps the sandbox proxy's handler: each request is counted by the
// class of its status, and the bytes of its body and its response (and of
// the connection, once upgraded to a WebSocket or another protocol) as
// they pass.
func (m *Metrics) Proxy(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{ResponseWriter: w, in: m.proxyBytesIn, out: m.proxyBytesOut}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &countingBody{ReadCloser: r.Body, n: m.proxyBytesIn}
		}
		defer func() {
			// Also when the handler panics (ReverseProxy's abort):
			// the request was answered, or cut, with what it sent.
			m.proxyRequests.WithLabelValues(statusClass(int(cw.status.Load()))).Inc()
		}()
		next.ServeHTTP(cw, r)
	})
}

// statusClass is "1xx" … "5xx"; no status written yet means 200, as
// net/http sends.
func statusClass(code int) string {
	switch {
	case code == 0:
		return "2xx"
	case code >= 100 && code < 600:
		return string(rune('0'+code/100)) + "xx"
	default:
		return "other"
	}
}

// countingBody counts what the handler reads of a request's body.
type countingBody struct {
	io.ReadCloser
	n prometheus.Counter
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.n.Add(float64(n))
	}
	return n, err
}

// countingWriter counts what is written to the client and remembers the
// first status. Flush and Hijack are its own (a hijacked connection is
// counted too); the other ResponseController features reach the
// server's writer through Unwrap.
type countingWriter struct {
	http.ResponseWriter
	in, out prometheus.Counter
	status  atomic.Int32
}

func (w *countingWriter) WriteHeader(code int) {
	// Informational headers (100 Continue, 103) precede the status.
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.status.CompareAndSwap(0, int32(code))
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.status.CompareAndSwap(0, http.StatusOK)
	n, err := w.ResponseWriter.Write(p)
	if n > 0 {
		w.out.Add(float64(n))
	}
	return n, err
}

func (w *countingWriter) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// FlushError is what http.ResponseController calls first.
func (w *countingWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands over the connection (httputil.ReverseProxy does for an
// upgrade, after which it writes the 101 itself), counting its bytes.
func (w *countingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.status.CompareAndSwap(0, http.StatusSwitchingProtocols)
	cc := &countingConn{Conn: conn, in: w.in, out: w.out}
	// The buffered writer must write through the counting connection;
	// what the server had already read stays in brw.Reader.
	if err := brw.Writer.Flush(); err != nil {
		conn.Close()
		return nil, nil, err
	}
	brw.Writer.Reset(cc)
	return cc, brw, nil
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// countingConn counts a hijacked connection's bytes both ways.
type countingConn struct {
	net.Conn
	in, out prometheus.Counter
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.in.Add(float64(n))
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.out.Add(float64(n))
	}
	return n, err
}
