package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/network"
)

// The kernel's half of the audit: slot chains log each new connection's
// verdict to an NFLOG group (network.Config.AuditGroup, prefix
// network.AuditPrefix); KernelAudit reads them over netlink and writes
// them as entries like the proxy's. Only the start of each packet is
// copied (its IPv4 and transport headers).

// nfnetlink_log's message and attribute numbers (linux/netfilter/nfnetlink_log.h).
const (
	nfulnlMsgPacket   = 0
	nfulnlMsgConfig   = 1
	nfulaPayload      = 9
	nfulaPrefix       = 10
	nfulaCfgCmd       = 1
	nfulaCfgMode      = 2
	nfulnlCfgCmdBind  = 1
	nfulnlCfgCmdUnbnd = 2
	nfulnlCopyPacket  = 2
	copyRange         = 64
)

// KernelAudit reads one NFLOG group until Close.
type KernelAudit struct {
	fd    int
	group uint16
	done  chan struct{}
}

// StartKernelAudit binds NFLOG group and writes each verdict it logs to
// the proxy's audit, naming the sandbox the proxy knows at the packet's
// source address.
func (p *Proxy) StartKernelAudit(group uint16) (*KernelAudit, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("egress: NFLOG socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("egress: NFLOG bind: %w", err)
	}
	// A read wakes up at least every second, so that Close is noticed.
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1})
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	if err := nflogConfig(fd, group, attr(nfulaCfgCmd, []byte{nfulnlCfgCmdBind, 0, 0, 0})); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("egress: binding NFLOG group %d: %w", group, err)
	}
	mode := make([]byte, 8)
	binary.BigEndian.PutUint32(mode, copyRange)
	mode[4] = nfulnlCopyPacket
	if err := nflogConfig(fd, group, attr(nfulaCfgMode, mode[:6])); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("egress: NFLOG copy mode: %w", err)
	}
	k := &KernelAudit{fd: fd, group: group, done: make(chan struct{})}
	go k.read(p)
	return k, nil
}

// Close unbinds the group and stops the reader.
func (k *KernelAudit) Close() error {
	select {
	case <-k.done:
		return nil
	default:
	}
	_ = nflogConfig(k.fd, k.group, attr(nfulaCfgCmd, []byte{nfulnlCfgCmdUnbnd, 0, 0, 0}))
	close(k.done)
	return nil
}

func (k *KernelAudit) read(p *Proxy) {
	defer unix.Close(k.fd)
	buf := make([]byte, 1<<16)
	for {
		select {
		case <-k.done:
			return
		default:
		}
		n, _, err := unix.Recvfrom(k.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
				continue
			}
			p.log.Warn("egress: reading the kernel's audit", "err", err)
			time.Sleep(time.Second)
			continue
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			continue
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket || len(m.Data) < 4 {
				continue
			}
			if e, ok := p.kernelEntry(m.Data[4:]); ok {
				p.cfg.Audit.Log(e)
			}
		}
	}
}

// kernelEntry turns one logged packet into an audit entry.
func (p *Proxy) kernelEntry(attrs []byte) (Entry, bool) {
	var prefix string
	var payload []byte
	for len(attrs) >= 4 {
		l := int(binary.NativeEndian.Uint16(attrs[0:2]))
		typ := binary.NativeEndian.Uint16(attrs[2:4]) &^ unix.NLA_F_NESTED
		if l < 4 || l > len(attrs) {
			break
		}
		switch typ {
		case nfulaPrefix:
			prefix = string(attrs[4:l])
		case nfulaPayload:
			payload = attrs[4:l]
		}
		attrs = attrs[(l+3)&^3:]
	}
	verdict, _, ok := network.ParseAuditPrefix(prefix)
	if !ok || len(payload) < 20 || payload[0]>>4 != 4 {
		return Entry{}, false
	}
	src := netip.AddrFrom4([4]byte(payload[12:16]))
	dst := netip.AddrFrom4([4]byte(payload[16:20]))
	proto, ihl := payload[9], int(payload[0]&0xf)*4
	sb, known := p.lookup(src)
	if !known {
		return Entry{}, false
	}
	e := Entry{Sandbox: sb.ID, Team: sb.TeamID, Dst: dst.String(), Proto: "ip/" + strconv.Itoa(int(proto)), Decision: Allow}
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		e.Proto = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[proto]
		if len(payload) >= ihl+4 {
			e.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(payload[ihl+2:ihl+4])).String()
		}
	case unix.IPPROTO_ICMP:
		e.Proto = "icmp"
	}
	v := judge(sb.Policy, netip.AddrPortFrom(dst, 0), "")
	e.Rule = v.rule
	if verdict == 'D' {
		e.Decision = Deny
	}
	return e, true
}

// nflogConfig sends one NFULNL_MSG_CONFIG for group and waits for its ack.
func nflogConfig(fd int, group uint16, attrs ...[]byte) error {
	body := []byte{unix.AF_UNSPEC, 0, byte(group >> 8), byte(group)} // nfgenmsg: family, version, res_id (big endian)
	for _, a := range attrs {
		body = append(body, a...)
	}
	hdr := make([]byte, unix.NLMSG_HDRLEN)
	binary.NativeEndian.PutUint32(hdr[0:4], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(hdr[4:6], unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgConfig)
	binary.NativeEndian.PutUint16(hdr[6:8], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(hdr[8:12], 1)
	if err := unix.Sendto(fd, append(hdr, body...), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(m.Data[0:4])); code != 0 {
					return unix.Errno(-code)
				}
				return nil
			}
		}
	}
}

// attr is a netlink attribute, padded to 4 bytes.
func attr(typ uint16, data []byte) []byte {
	l := 4 + len(data)
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:2], uint16(l))
	binary.NativeEndian.PutUint16(b[2:4], typ)
	copy(b[4:], data)
	return b
}
