package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
)

// Full duplex, and the connection after it. Both proxies enable full
// duplex (see Proxy.ServeHTTP): the upstream may answer before it has
// read the request body. Then the transport may still be copying the
// body upstream when the handler returns, and net/http, reading the
// connection for the next request, meets that read and panics ("invalid
// concurrent Body.Read call"), dropping the answer it had sent: a client
// POSTing to an app that answers at once (Python's http.server refusing a
// method) got a cut connection or, through an api, a 502. So an exchange
// whose answer starts before its request body ended closes its
// connection after the answer ("Connection: close"): nothing reads the
// connection but the transport.

type bodyStateKey struct{}

// trackedBody records whether its body was read to its end.
type trackedBody struct {
	io.ReadCloser
	ended atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.ended.Store(true)
	}
	return n, err
}

// fullDuplex enables full duplex on w and returns r with its body
// tracked, for unfinished to read.
func fullDuplex(w http.ResponseWriter, r *http.Request) *http.Request {
	_ = http.NewResponseController(w).EnableFullDuplex()
	// Over HTTP/2 a request is a stream of its own: nothing else reads
	// it, and "Connection: close" would end every stream of the
	// connection (the server sends GOAWAY).
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody {
		return r
	}
	tb := &trackedBody{ReadCloser: r.Body}
	r = r.WithContext(context.WithValue(r.Context(), bodyStateKey{}, tb))
	r.Body = tb
	return r
}

// closeIfUnread marks h (an answer's header, before it is written) to
// close the connection when the request of ctx has a body not yet read
// to its end.
func closeIfUnread(ctx context.Context, h http.Header) {
	if tb, ok := ctx.Value(bodyStateKey{}).(*trackedBody); ok && !tb.ended.Load() {
		h.Set("Connection", "close")
	}
}

// closeUnreadOnAnswer is a ReverseProxy's ModifyResponse: see
// closeIfUnread.
func closeUnreadOnAnswer(res *http.Response) error {
	closeIfUnread(res.Request.Context(), res.Header)
	return nil
}
