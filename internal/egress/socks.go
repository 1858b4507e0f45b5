package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/net/proxy"
	"golang.org/x/sys/unix"
)

// socks5Handshake asks the SOCKS5 proxy on c (RFC 1928) for a tunnel to
// target, with RFC 1929 user/password when up has a username. A name in
// target goes as a name (ATYP domain): the proxy resolves it, as E2B's
// egress proxy has it for domain-matched flows. x/net's client does the
// protocol, reading exactly each reply's length; handshakeGuard refuses
// what it lets through: a method that was not offered, and bytes the
// proxy sends before it was asked (a success or data pipelined ahead of
// the request it would answer). On success c is the tunnel itself:
// x/net keeps nothing buffered, so what the destination sent right
// after the reply is the first thing read from c.
func socks5Handshake(ctx context.Context, c net.Conn, up *UpstreamProxy, target string) (net.Conn, error) {
	var auth *proxy.Auth
	if up.Username != "" {
		auth = &proxy.Auth{User: up.Username, Password: up.Password}
	}
	g := &handshakeGuard{Conn: c}
	d, err := proxy.SOCKS5("tcp", c.RemoteAddr().String(), auth, g)
	if err != nil {
		return nil, err
	}
	cd, ok := d.(proxy.ContextDialer)
	if !ok {
		return nil, errors.New("golang.org/x/net/proxy's SOCKS5 dialer takes no context")
	}
	if _, err := cd.DialContext(ctx, "tcp", target); err != nil {
		if g.err != nil {
			return nil, fmt.Errorf("SOCKS5 to %s: %w", target, g.err)
		}
		return nil, fmt.Errorf("SOCKS5: %w", err)
	}
	if g.err != nil {
		return nil, fmt.Errorf("SOCKS5 to %s: %w", target, g.err)
	}
	return c, nil
}

// handshakeGuard is the proxy connection during the SOCKS5 handshake,
// and the forward dialer that hands it to x/net's client. It checks the
// method the proxy chose against the ones offered (the first message
// the client writes), and, before each later message, that the proxy
// has sent nothing beyond the replies read so far.
type handshakeGuard struct {
	net.Conn
	dialled bool
	writes  int
	offered []byte // the methods of the client's greeting
	method  []byte // the proxy's method reply, as read
	err     error  // the first fault found
}

// DialContext hands over the proxy connection, once.
func (g *handshakeGuard) DialContext(context.Context, string, string) (net.Conn, error) {
	if g.dialled {
		return nil, errors.New("egress: the SOCKS5 proxy connection was asked for twice")
	}
	g.dialled = true
	return g, nil
}

func (g *handshakeGuard) Dial(network, addr string) (net.Conn, error) {
	return g.DialContext(context.Background(), network, addr)
}

var (
	errUnasked    = errors.New("the proxy sent bytes before it was asked (a reply pipelined ahead of its request)")
	errNotOffered = errors.New("the proxy chose a method it was not offered")
)

func (g *handshakeGuard) Write(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.writes == 0 && len(p) >= 2 && int(p[1]) == len(p)-2 {
		g.offered = append([]byte(nil), p[2:]...)
	} else if n := pending(g.Conn); n > 0 {
		g.err = errUnasked
		return 0, g.err
	}
	g.writes++
	return g.Conn.Write(p)
}

func (g *handshakeGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if g.writes == 1 && len(g.method) < 2 {
		take := min(n, 2-len(g.method))
		g.method = append(g.method, p[:take]...)
		if len(g.method) == 2 && g.method[0] == 5 && g.method[1] != 0xff && !containsByte(g.offered, g.method[1]) {
			g.err = errNotOffered
			return 0, g.err
		}
	}
	return n, err
}

func containsByte(b []byte, x byte) bool {
	for _, y := range b {
		if y == x {
			return true
		}
	}
	return false
}

// pending reports how many bytes c has received that nobody has read
// yet, without waiting or consuming them; 0 when it cannot tell.
func pending(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	var n int
	var buf [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		k, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err == nil {
			n = k
		}
		return true
	})
	return n
}
