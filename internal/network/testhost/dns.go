package testhost

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS is a minimal authoritative DNS server on port 53 of a test host,
// over UDP and TCP. It answers A queries for the names it was given and
// NXDOMAIN for any other name.
type DNS struct {
	records map[string]netip.Addr // lower-case, fully qualified ("name.")
	udp     atomic.Int64
	tcp     atomic.Int64
	pc      *net.UDPConn
	ln      *net.TCPListener
}

// StartDNS starts a DNS server on the test host that resolves each name of
// records (e.g. "probe.warren.test") to its IPv4 address. It stops at the
// host's Close, or its own.
func (h *Host) StartDNS(records map[string]netip.Addr) (*DNS, error) {
	d := &DNS{records: map[string]netip.Addr{}}
	for name, addr := range records {
		d.records[strings.ToLower(strings.TrimSuffix(name, "."))+"."] = addr
	}
	var err error
	if d.pc, err = h.ListenUDP(53); err != nil {
		return nil, err
	}
	if d.ln, err = h.ListenTCP(53); err != nil {
		d.pc.Close()
		return nil, err
	}
	go d.serveUDP(d.pc)
	go d.serveTCP(d.ln)
	return d, nil
}

// ServeDNS is StartDNS for a test: the server stops at the end of the test.
func (h *Host) ServeDNS(t testing.TB, records map[string]netip.Addr) *DNS {
	t.Helper()
	d, err := h.StartDNS(records)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// Close stops the server; after the host's Close it does nothing.
func (d *DNS) Close() error {
	var errs []error
	for _, err := range []error{d.pc.Close(), d.ln.Close()} {
		if !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Queries returns how many queries arrived over UDP and over TCP.
func (d *DNS) Queries() (udp, tcp int64) { return d.udp.Load(), d.tcp.Load() }

func (d *DNS) serveUDP(pc *net.UDPConn) {
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		d.udp.Add(1)
		if resp, err := d.answer(buf[:n]); err == nil {
			_, _ = pc.WriteToUDPAddrPort(resp, from)
		}
	}
}

func (d *DNS) serveTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go d.serveConn(c)
	}
}

// serveConn answers length-prefixed queries on one TCP connection (RFC
// 1035 4.2.2) until the client closes it or stays idle.
func (d *DNS) serveConn(c net.Conn) {
	defer c.Close()
	for {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		var size [2]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		d.tcp.Add(1)
		resp, err := d.answer(msg)
		if err != nil {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// answer builds the response to one query message.
func (d *DNS) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	hdr, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	if hdr.Response {
		return nil, errors.New("not a query")
	}
	addr, known := d.records[strings.ToLower(q.Name.String())]
	rcode := dnsmessage.RCodeSuccess
	if !known {
		rcode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: hdr.ID, Response: true, Authoritative: true, RecursionDesired: hdr.RecursionDesired, RCode: rcode,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if known && q.Type == dnsmessage.TypeA && q.Class == dnsmessage.ClassINET {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}
		if err := b.AResource(rh, dnsmessage.AResource{A: addr.As4()}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// Lookup asks the DNS server at server (host:port) over network ("udp" or
// "tcp") for name's A record, from the calling thread's network namespace
// (net.Resolver would dial from other threads). It returns the first
// address of the answer.
func Lookup(network, server, name string, timeout time.Duration) (netip.Addr, error) {
	qname, err := dnsmessage.NewName(strings.TrimSuffix(name, ".") + ".")
	if err != nil {
		return netip.Addr{}, err
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x5741, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: qname, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	query, err := b.Finish()
	if err != nil {
		return netip.Addr{}, err
	}
	c, err := net.DialTimeout(network, server, timeout)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	resp := make([]byte, 512)
	var n int
	if network == "tcp" {
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(query))), query...)); err != nil {
			return netip.Addr{}, err
		}
		var size [2]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return netip.Addr{}, err
		}
		resp = make([]byte, binary.BigEndian.Uint16(size[:]))
		n, err = io.ReadFull(c, resp)
	} else {
		if _, err := c.Write(query); err != nil {
			return netip.Addr{}, err
		}
		n, err = c.Read(resp)
	}
	if err != nil {
		return netip.Addr{}, err
	}
	var msg dnsmessage.Message
	if err := msg.Unpack(resp[:n]); err != nil {
		return netip.Addr{}, err
	}
	if msg.RCode != dnsmessage.RCodeSuccess {
		return netip.Addr{}, fmt.Errorf("%s: %v", name, msg.RCode)
	}
	for _, a := range msg.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			return netip.AddrFrom4(r.A), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%s: no A record in the answer", name)
}
