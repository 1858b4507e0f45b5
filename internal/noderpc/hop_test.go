package noderpc_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/proxy"
)

// oneSandbox resolves every sandbox to the loopback address, where the
// benchmark's upstream listens.
type oneSandbox struct{}

func (oneSandbox) Resolve(context.Context, string) (proxy.Target, error) {
	return proxy.Target{IP: netip.MustParseAddr("127.0.0.1")}, nil
}
func (oneSandbox) Resume(context.Context, string) error       { return nil }
func (oneSandbox) Track(string, func()) (func(), error)       { return func() {}, nil }
func (oneSandbox) SignedBy(func(string) bool) (string, error) { return "", proxy.ErrNotFound }

// BenchmarkProxyHop is the software cost of the api role's hop on
// loopback: a small request and answer through a node's proxy alone (as
// role all serves it), and through an api's forwarder and the node's
// internal address (the cluster HMACs both ways) to the same proxy.
func BenchmarkProxyHop(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer upstream.Close()
	port := upstream.URL[strings.LastIndexByte(upstream.URL, ':')+1:]
	nodeProxy := proxy.New(proxy.Config{Domain: "localhost", Resolver: oneSandbox{}})
	auth, _ := cluster.NewAuth([]byte(strings.Repeat("b", 32)))
	direct := httptest.NewServer(nodeProxy)
	defer direct.Close()
	node := httptest.NewServer(noderpc.Handler(noderpc.Served{Traffic: nodeProxy}, auth.Guard("n1")))
	defer node.Close()
	nodeAddr := strings.TrimPrefix(node.URL, "http://")
	fwd := httptest.NewServer(proxy.NewForwarder(proxy.ForwardConfig{Domain: "localhost",
		Locate:    func(context.Context, string) (string, string, error) { return "n1", nodeAddr, nil },
		SignedBy:  func(func(string) bool) (string, error) { return "", proxy.ErrNotFound },
		Transport: noderpc.NewTransport(auth), ClientAddrHeader: noderpc.ClientAddrHeader}))
	defer fwd.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, c := range []struct{ name, url string }{{"direct", direct.URL}, {"through-api", fwd.URL}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				req, _ := http.NewRequest("GET", c.url+"/x", nil)
				req.Host = port + "-sbx1.localhost"
				res, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if string(body) != "ok" {
					b.Fatalf("%d %q", res.StatusCode, body)
				}
			}
		})
	}
}
