// Command egresshost runs the stand-in "internet" that the egress tests
// and benchmarks of test/e2e reach from sandboxes: test hosts in network
// namespaces of their own (internal/network/testhost) in 198.18.0.0/15,
// so that no packet leaves the machine.
//
//   - web1 (198.18.10.2) and web2 (198.18.11.2): HTTP on 80 and 8080,
//     HTTPS on 443 and 8443 with a certificate of a test CA, a UDP echo
//     on 9999; every HTTP answer
//     is "server=<name> host=<Host>" and the request's headers, one per
//     line, sorted. GET /__stats answers {"requests": N}; GET /bytes?n=N
//     answers N bytes (for throughput).
//   - dns (198.18.12.2): resolves api.example.test, www.example.test and
//     d<N>.example.test to web1, other.test to web2.
//   - proxy (198.18.13.2): an HTTP CONNECT proxy on 3128 that wants
//     user:pass; http://198.18.13.2:9000/ answers {"tunnels": N}.
//
// It prints one JSON line with the addresses, the test CA's file and a
// resolv.conf naming the DNS host, then runs until its standard input
// closes, and removes the hosts.
package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/network/testhost"
)

func main() {
	prefix := flag.String("prefix", "e14", "name prefix of the test hosts")
	flag.Parse()
	if err := run(*prefix); err != nil {
		fmt.Fprintln(os.Stderr, "egresshost:", err)
		os.Exit(1)
	}
}

type output struct {
	Web1, Web2, DNS, Proxy string
	CAFile, ResolvConf     string
}

func run(prefix string) error {
	dir, err := os.MkdirTemp("", "egresshost-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ca, leaf, err := makeCerts(dir)
	if err != nil {
		return err
	}
	_ = ca
	var hosts []*testhost.Host
	defer func() {
		for _, h := range hosts {
			h.Close()
		}
	}()
	open := func(name, addr string) (*testhost.Host, error) {
		h, err := testhost.Open(prefix+name, netip.MustParsePrefix(addr+"/24"))
		if err == nil {
			hosts = append(hosts, h)
		}
		return h, err
	}
	out := output{Web1: "198.18.10.2", Web2: "198.18.11.2", DNS: "198.18.12.2", Proxy: "198.18.13.2",
		CAFile: filepath.Join(dir, "ca.pem"), ResolvConf: filepath.Join(dir, "resolv.conf")}
	for name, addr := range map[string]string{"web1": out.Web1, "web2": out.Web2} {
		h, err := open(name[:1]+name[3:], addr)
		if err != nil {
			return err
		}
		if err := serveWeb(h, name, leaf); err != nil {
			return err
		}
	}
	dnsHost, err := open("dn", out.DNS)
	if err != nil {
		return err
	}
	records := map[string]netip.Addr{
		"api.example.test": netip.MustParseAddr(out.Web1), "www.example.test": netip.MustParseAddr(out.Web1),
		"other.test": netip.MustParseAddr(out.Web2),
	}
	for i := range 200 {
		records[fmt.Sprintf("d%d.example.test", i)] = netip.MustParseAddr(out.Web1)
	}
	if _, err := dnsHost.StartDNS(records); err != nil {
		return err
	}
	proxyHost, err := open("px", out.Proxy)
	if err != nil {
		return err
	}
	if err := serveConnect(proxyHost); err != nil {
		return err
	}
	if err := os.WriteFile(out.ResolvConf, []byte("nameserver "+out.DNS+"\n"), 0o644); err != nil {
		return err
	}
	// Each answers the host before anybody relies on it.
	for _, u := range []string{"http://" + out.Web1 + "/__stats", "http://" + out.Web2 + ":8080/__stats", "http://" + out.Proxy + ":9000/"} {
		if err := check(u); err != nil {
			return err
		}
	}
	if got, err := testhost.Lookup("udp", out.DNS+":53", "api.example.test", 5*time.Second); err != nil || got.String() != out.Web1 {
		return fmt.Errorf("the DNS host does not answer: %v %v", got, err)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

func check(url string) error {
	c := http.Client{Timeout: 5 * time.Second}
	res, err := c.Get(url)
	if err != nil {
		return fmt.Errorf("%s does not answer the host: %w", url, err)
	}
	res.Body.Close()
	return nil
}

// web answers with its name, the Host and the request headers.
type web struct {
	name     string
	requests atomic.Int64
}

func (w *web) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/__stats":
		fmt.Fprintf(rw, `{"requests":%d}`, w.requests.Load())
		return
	case "/bytes":
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		n = min(max(n, 0), 1<<30)
		rw.Header().Set("Content-Length", strconv.Itoa(n))
		buf := make([]byte, 64<<10)
		for n > 0 {
			k := min(n, len(buf))
			if _, err := rw.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
		return
	}
	w.requests.Add(1)
	var lines []string
	for k, v := range r.Header {
		lines = append(lines, k+": "+strings.Join(v, ","))
	}
	sort.Strings(lines)
	fmt.Fprintf(rw, "server=%s host=%s\n%s\n", w.name, r.Host, strings.Join(lines, "\n"))
}

func serveWeb(h *testhost.Host, name string, leaf tls.Certificate) error {
	handler := &web{name: name}
	udp, err := h.ListenUDP(9999) // a UDP echo
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := udp.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = udp.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	for _, port := range []int{80, 8080, 443, 8443} {
		ln, err := h.ListenTCP(port)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		if port == 443 || port == 8443 {
			srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{leaf}}
			go srv.ServeTLS(ln, "", "")
		} else {
			go srv.Serve(ln)
		}
	}
	return nil
}

// serveConnect runs a CONNECT proxy on 3128 wanting user:pass, and its
// counter on 9000.
func serveConnect(h *testhost.Host) error {
	var tunnels atomic.Int64
	ln, err := h.ListenTCP(3128)
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go tunnel(c, &tunnels)
		}
	}()
	stats, err := h.ListenTCP(9000)
	if err != nil {
		return err
	}
	go http.Serve(stats, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"tunnels":%d}`, tunnels.Load())
	}))
	return nil
}

func tunnel(c net.Conn, tunnels *atomic.Int64) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	if req.Header.Get("Proxy-Authorization") != "Basic "+base64.StdEncoding.EncodeToString([]byte("user:pass")) {
		fmt.Fprint(c, "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
		return
	}
	// The proxy's own host is in its namespace: it reaches the other test
	// hosts through the host's routes, like any internet host.
	up, err := net.DialTimeout("tcp4", req.Host, 5*time.Second)
	if err != nil {
		fmt.Fprint(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer up.Close()
	tunnels.Add(1)
	_ = c.SetDeadline(time.Time{})
	fmt.Fprint(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() { io.Copy(up, br); up.(*net.TCPConn).CloseWrite() }()
	io.Copy(c, up)
}

// makeCerts makes a test CA (written to dir/ca.pem) and a certificate it
// signs for the test names.
func makeCerts(dir string) (*x509.Certificate, tls.Certificate, error) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egresshost test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "api.example.test"},
		DNSNames:  []string{"api.example.test", "www.example.test", "*.example.test", "other.test"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return nil, tls.Certificate{}, err
	}
	if ca == nil {
		return nil, tls.Certificate{}, errors.New("the test CA does not parse")
	}
	return ca, tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}, nil
}
