package security

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
)

// Test hosts: each is a network namespace of its own joined to the host by
// a veth pair, so that traffic to its address never leaves the machine.
const (
	// Addresses no other package's tests use (internal/node and
	// internal/network have theirs in 10.201.0.0/24); the metadata
	// address is the one address all must share.
	privHostAddr = "172.31.201.2" // a private-range host
	privHostPort = 8080
	metaHostAddr = "169.254.169.254" // a stand-in cloud metadata server
	metaHostPort = 80
	dnsHostAddr  = "10.203.0.2" // the resolver given to --resolv-conf, in 10/8 as this machine's
	dnsOtherPort = 8053         // a port of the resolver other than 53
	// dnsName resolves to dnsAnswer at the test resolver, and nowhere else.
	dnsName   = "probe.warren-sec.test"
	dnsAnswer = "198.18.0.7"
)

// testHost is one test host.
type testHost struct {
	ns, veth   string
	addr, gw   string
	bits       int
	listeners  []io.Closer
	served     atomic.Int64 // connections accepted, queries answered
	dnsQueries atomic.Int64
}

type testHosts struct {
	priv, meta, dns *testHost
}

func newTestHosts() (*testHosts, error) {
	h := &testHosts{
		priv: &testHost{ns: "wsectest-priv", veth: "wsectp0", addr: privHostAddr, gw: "172.31.201.1", bits: 24},
		meta: &testHost{ns: "wsectest-meta", veth: "wsectm0", addr: metaHostAddr, gw: "169.254.169.1", bits: 24},
		dns:  &testHost{ns: "wsectest-dns", veth: "wsectd0", addr: dnsHostAddr, gw: "10.203.0.1", bits: 24},
	}
	for _, th := range h.all() {
		if err := th.create(); err != nil {
			return h, err
		}
	}
	if err := h.priv.serveHTTP(privHostPort, "private-host"); err != nil {
		return h, err
	}
	if err := h.meta.serveHTTP(metaHostPort, "metadata-host"); err != nil {
		return h, err
	}
	if err := h.dns.serveHTTP(dnsOtherPort, "resolver-other-port"); err != nil {
		return h, err
	}
	if err := h.dns.serveDNS(); err != nil {
		return h, err
	}
	return h, nil
}

func (h *testHosts) all() []*testHost { return []*testHost{h.priv, h.meta, h.dns} }

// isGateway tells whether ip is the host's end of a test host's veth.
func (h *testHosts) isGateway(ip string) bool {
	for _, th := range h.all() {
		if th.gw == ip {
			return true
		}
	}
	return false
}

func (h *testHosts) remove() error {
	var errs []error
	for _, th := range h.all() {
		errs = append(errs, th.remove())
	}
	return errors.Join(errs...)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// create makes the namespace, the veth pair and the routes, and checks
// that the host routes the test host's address into it.
func (th *testHost) create() error {
	th.remove() // a leftover of an interrupted run
	bits := fmt.Sprint(th.bits)
	for _, args := range [][]string{
		{"netns", "add", th.ns},
		{"link", "add", th.veth, "type", "veth", "peer", "name", "eth0", "netns", th.ns},
		{"addr", "add", th.gw + "/" + bits, "dev", th.veth},
		{"link", "set", th.veth, "up"},
		{"-n", th.ns, "addr", "add", th.addr + "/" + bits, "dev", "eth0"},
		{"-n", th.ns, "link", "set", "eth0", "up"},
		{"-n", th.ns, "link", "set", "lo", "up"},
		{"-n", th.ns, "route", "add", "default", "via", th.gw},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	out, err := exec.Command("ip", "route", "get", th.addr).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev "+th.veth+" ") {
		return fmt.Errorf("test host %s: the route to %s does not go to its veth %s: %s (%v)", th.ns, th.addr, th.veth, out, err)
	}
	return nil
}

func (th *testHost) remove() error {
	for _, l := range th.listeners {
		l.Close()
	}
	th.listeners = nil
	_ = exec.Command("ip", "link", "del", th.veth).Run()
	if err := exec.Command("ip", "netns", "del", th.ns).Run(); err != nil && exists("/var/run/netns/"+th.ns) {
		return fmt.Errorf("removing test host %s: %w", th.ns, err)
	}
	return nil
}

// inNS runs f with the calling thread in the test host's namespace: the
// sockets f makes stay there.
func (th *testHost) inNS(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	ns, err := netns.GetFromName(th.ns)
	if err != nil {
		return err
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		return err
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		// The thread is in the wrong namespace: never let it run Go code again.
		panic(fmt.Sprintf("returning from test host %s: %v", th.ns, err))
	}
	return ferr
}

// serveHTTP answers every request on port with body, counting connections.
func (th *testHost) serveHTTP(port int, body string) error {
	var ln net.Listener
	if err := th.inNS(func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", th.addr, port))
		return err
	}); err != nil {
		return err
	}
	th.listeners = append(th.listeners, ln)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body+"\n") }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				th.served.Add(1)
			}
		},
		ReadHeaderTimeout: 5 * time.Second,
	}
	go srv.Serve(ln)
	return nil
}

// serveDNS answers A queries for dnsName with dnsAnswer on port 53, UDP
// and TCP; anything else gets NXDOMAIN.
func (th *testHost) serveDNS() error {
	var pc net.PacketConn
	var ln net.Listener
	if err := th.inNS(func() (err error) {
		if pc, err = net.ListenPacket("udp4", th.addr+":53"); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", th.addr+":53")
		return err
	}); err != nil {
		return err
	}
	th.listeners = append(th.listeners, pc, ln)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp, err := th.answer(buf[:n]); err == nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				for {
					var n uint16
					if binary.Read(c, binary.BigEndian, &n) != nil {
						return
					}
					q := make([]byte, n)
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					resp, err := th.answer(q)
					if err != nil {
						return
					}
					c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(resp))))
					c.Write(resp)
				}
			}()
		}
	}()
	return nil
}

func (th *testHost) answer(q []byte) ([]byte, error) {
	var p dnsmessage.Parser
	hdr, err := p.Start(q)
	if err != nil {
		return nil, err
	}
	question, err := p.Question()
	if err != nil {
		return nil, err
	}
	th.dnsQueries.Add(1)
	resp := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true, RecursionDesired: hdr.RecursionDesired})
	resp.EnableCompression()
	name := strings.TrimSuffix(strings.ToLower(question.Name.String()), ".")
	found := name == dnsName
	if !found {
		resp = dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true, RCode: dnsmessage.RCodeNameError})
	}
	if err := resp.StartQuestions(); err != nil {
		return nil, err
	}
	if err := resp.Question(question); err != nil {
		return nil, err
	}
	if found && question.Type == dnsmessage.TypeA {
		if err := resp.StartAnswers(); err != nil {
			return nil, err
		}
		a := net.ParseIP(dnsAnswer).To4()
		if err := resp.AResource(dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 5},
			dnsmessage.AResource{A: [4]byte{a[0], a[1], a[2], a[3]}}); err != nil {
			return nil, err
		}
	}
	return resp.Finish()
}

// hostListener is a service on all the host's addresses (in the host's
// own namespace), which sandboxes must not reach.
type hostListener struct {
	net.Listener
	port     int
	accepted atomic.Int64
}

func listenHostService() (*hostListener, error) {
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		return nil, err
	}
	h := &hostListener{Listener: ln, port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nhost-service\n")
			c.Close()
		}
	}()
	return h, nil
}
