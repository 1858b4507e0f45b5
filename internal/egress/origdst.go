package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// originalDst is where a connection the kernel redirected to the proxy
// was going: SO_ORIGINAL_DST, from conntrack's NAT record. A connection
// that was not redirected has none.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("egress: not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var mreq *unix.IPv6Mreq
	var serr error
	if err := raw.Control(func(fd uintptr) {
		// A sockaddr_in comes back in the 16 bytes of an IPv6Mreq.
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("egress: SO_ORIGINAL_DST: %w", serr)
	}
	b := mreq.Multiaddr
	port := binary.BigEndian.Uint16(b[2:4])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port), nil
}

// reset closes c with a TCP reset rather than a FIN: the sandbox's
// connection fails at once, as a refused one does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
