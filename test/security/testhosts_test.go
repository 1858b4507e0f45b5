package security

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/network/testhost"
)

// Test hosts (internal/network/testhost): each is a network namespace of
// its own joined to the host by a veth pair, so that traffic to its
// address never leaves the machine.
const (
	// Addresses no other package's tests use (internal/node and
	// internal/network have theirs in 10.201.0.0/24); the metadata
	// address is the one address all share, and testhost's lock on it
	// makes the packages take turns.
	privHostAddr = "172.31.201.2" // a private-range host
	privHostPort = 8080
	metaHostAddr = "169.254.169.254" // a stand-in cloud metadata server
	metaHostPort = 80
	dnsHostAddr  = "10.203.0.2" // the resolver given to --resolv-conf, in 10/8 as this machine's
	dnsOtherPort = 8053         // a port of the resolver other than 53
	// dnsName resolves to dnsAnswer at the test resolver, and nowhere else.
	dnsName   = "probe.warren-sec.test"
	dnsAnswer = "198.18.0.7"
	// An "internet" host for the egress policy cases (issue 14): HTTP on
	// pubHostPort answers with the request's headers. pubName resolves to
	// it; privName and metaName resolve to the private and metadata hosts
	// (a name that an allowOut domain matches must still not open them).
	pubHostAddr = "198.18.207.2"
	pubHostPort = 8080
	pubName     = "api.warren-sec.test"
	privName    = "private.warren-sec.test"
	metaName    = "metadata.warren-sec.test"
)

type testHosts struct {
	priv, meta, dns *testhost.Host
	// pub is the egress cases' internet host; pubSeen counts the requests
	// it answered.
	pub     *testhost.Host
	pubSeen atomic.Int64
}

// newTestHosts makes the test hosts and their servers, and checks from
// the host that each answers: what a sandbox cannot reach is refused by
// the policy, not missing.
func newTestHosts() (*testHosts, error) {
	h := &testHosts{}
	for _, th := range []struct {
		host       **testhost.Host
		name, addr string
		port       int
		reply      string
	}{
		{&h.priv, "wsectp", privHostAddr, privHostPort, "private-host"},
		{&h.meta, "wsectm", metaHostAddr, metaHostPort, "metadata-host"},
		{&h.dns, "wsectd", dnsHostAddr, dnsOtherPort, "resolver-other-port"},
	} {
		var err error
		if *th.host, err = testhost.Open(th.name, netip.MustParsePrefix(th.addr+"/24")); err != nil {
			return h, err
		}
		if w := (*th.host).Waited; w > time.Second {
			fmt.Printf("test/security: waited %s for another test host at %s\n", w.Round(time.Second), th.addr)
		}
		if _, err := (*th.host).StartTCP(th.port, testhost.HTTPReply(th.reply+"\n")); err != nil {
			return h, err
		}
		if err := answers(fmt.Sprintf("%s:%d", th.addr, th.port), th.reply); err != nil {
			return h, err
		}
	}
	if _, err := h.dns.StartDNS(map[string]netip.Addr{
		dnsName: netip.MustParseAddr(dnsAnswer), pubName: netip.MustParseAddr(pubHostAddr),
		privName: netip.MustParseAddr(privHostAddr), metaName: netip.MustParseAddr(metaHostAddr),
	}); err != nil {
		return h, err
	}
	if err := h.startPub(); err != nil {
		return h, err
	}
	for _, network := range []string{"udp", "tcp"} {
		if got, err := testhost.Lookup(network, dnsHostAddr+":53", dnsName, 5*time.Second); err != nil || got.String() != dnsAnswer {
			return h, fmt.Errorf("the test resolver does not answer the host over %s: %s, %v", network, got, err)
		}
	}
	return h, nil
}

// answers checks that the server at addr answers the host with body.
func answers(addr, body string) error {
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("test host %s does not answer the host: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil || !strings.HasSuffix(string(b), "\r\n\r\n"+body+"\n") {
		return fmt.Errorf("test host %s answers the host with %q (%v), want %q", addr, b, err, body)
	}
	return nil
}

func (h *testHosts) all() []*testhost.Host { return []*testhost.Host{h.priv, h.meta, h.dns, h.pub} }

// startPub starts the internet host: HTTP that answers "public-host" and
// the request's headers, one "Name: value" a line.
func (h *testHosts) startPub() error {
	var err error
	if h.pub, err = testhost.Open("wsectw", netip.MustParsePrefix(pubHostAddr+"/24")); err != nil {
		return err
	}
	ln, err := h.pub.ListenTCP(pubHostPort)
	if err != nil {
		return err
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.pubSeen.Add(1)
		var b strings.Builder
		b.WriteString("public-host host=" + r.Host + "\n")
		for name, vals := range r.Header {
			for _, v := range vals {
				b.WriteString(name + ": " + v + "\n")
			}
		}
		io.WriteString(w, b.String())
	}))
	res, err := (&http.Client{Timeout: 5 * time.Second}).Get(fmt.Sprintf("http://%s:%d/", pubHostAddr, pubHostPort))
	if err != nil {
		return fmt.Errorf("the internet test host does not answer the host: %w", err)
	}
	res.Body.Close()
	return nil
}

// accepted is how many connections the test hosts' servers (but the
// resolver's port 53) have accepted.
func (h *testHosts) accepted() int64 {
	var n int64
	for _, th := range h.all() {
		n += th.Accepted()
	}
	return n
}

func (h *testHosts) remove() error {
	var errs []error
	for _, th := range h.all() {
		if th != nil {
			errs = append(errs, th.Close())
		}
	}
	return errors.Join(errs...)
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
	go testhost.Answer(ln, testhost.HTTPReply("host-service\n"), &h.accepted)
	return h, nil
}
