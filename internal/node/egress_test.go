package node

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/network/testhost"
	"github.com/warren-sandbox/warren/internal/resolvconf"
)

// The egress policy seen from real sandboxes: they probe test hosts this
// test creates, each in a namespace of its own (testhost checks with
// `ip route get` that the address routes there before anything is sent).
func TestSandboxEgress(t *testing.T) {
	for i, rtName := range []string{"runc", "runsc"} {
		t.Run(rtName, func(t *testing.T) {
			setupFixture(t)
			private := testhost.New(t, "wntep", netip.MustParsePrefix("10.201.0.2/24"))
			metadata := testhost.New(t, "wntem", netip.MustParsePrefix("169.254.169.254/30"))
			public := testhost.New(t, "wntew", netip.MustParsePrefix("198.18.0.2/30"))
			privatePort := private.ServeTCP(t, 0, testhost.HTTPReply("private"))
			metadata.ServeTCP(t, 80, testhost.HTTPReply("metadata"))
			publicPort := public.ServeTCP(t, 0, testhost.HTTPReply("public"))
			dns := private.ServeDNS(t, map[string]netip.Addr{"probe.warren.test": netip.MustParseAddr("198.18.0.99")})
			// Each answers the host: what a sandbox cannot reach is refused
			// by the policy, not missing.
			for _, a := range []string{
				fmt.Sprintf("%s:%d", private.Addr, privatePort), metadata.Addr.String() + ":80", fmt.Sprintf("%s:%d", public.Addr, publicPort),
			} {
				if got := hostGet(a); got != "private" && got != "metadata" && got != "public" {
					t.Fatalf("test host %s from the host: %s", a, got)
				}
			}

			// The resolv.conf sandboxes get: the private test host is the
			// resolver, with a search domain and options.
			rc := resolvconf.Config{
				Nameservers: []netip.Addr{private.Addr}, Search: []string{"warren.test"}, Options: []string{"timeout:2", "attempts:2"},
			}
			resolvPath := filepath.Join(t.TempDir(), "resolv.conf")
			if err := rc.WriteFile(resolvPath); err != nil {
				t.Fatal(err)
			}
			r := rtName[3:4]
			cidr := func(third int) netip.Prefix {
				return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 124, byte(third + 32*i), 0}), 20)
			}
			probes := fmt.Sprintf(`probe() { out=$(curl -s -m 5 "http://$2/"); echo "$1 $? $out"; }
probe private %s:%d
probe metadata %s:80
probe public %s:%d
echo "dns $(getent hosts probe.warren.test | tr -s ' ')"
echo "search $(getent hosts probe | tr -s ' ')"
if timeout 5 bash -c 'exec 3<>/dev/tcp/%s/53'; then echo "dns-tcp open"; else echo "dns-tcp closed"; fi
cat /etc/resolv.conf | grep -v '^#'`, private.Addr, privatePort, metadata.Addr, public.Addr, publicPort, private.Addr)

			t.Run("default", func(t *testing.T) {
				n := newTestNode(t, rtName, network.Config{CIDR: cidr(32), Prefix: "wnte" + r, PoolSize: -1,
					Resolvers: []netip.Addr{private.Addr}}, resolvPath)
				inst := create(t, n, baseRequest(t, "egr-"+rtName+"-default"))
				out, _ := sh(t, inst, "tok-"+inst.ID, "", probes, time.Minute)
				// curl: 7 is "could not connect" (refused at once), 28 a timeout.
				want := "private 7 \nmetadata 7 \npublic 0 public\n" +
					"dns 198.18.0.99 probe.warren.test\nsearch 198.18.0.99 probe.warren.test\ndns-tcp open\n" +
					"nameserver 10.201.0.2\nsearch warren.test\noptions timeout:2 attempts:2\n"
				if out != want {
					t.Errorf("from a sandbox:\n%s\nwant:\n%s", out, want)
				}
				if udp, _ := dns.Queries(); udp == 0 {
					t.Error("the test DNS server saw no query over UDP")
				}
			})
			t.Run("allowed", func(t *testing.T) {
				n := newTestNode(t, rtName, network.Config{CIDR: cidr(48), Prefix: "wnta" + r, PoolSize: -1,
					Resolvers: []netip.Addr{private.Addr}, AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.201.0.0/24")}}, resolvPath)
				inst := create(t, n, baseRequest(t, "egr-"+rtName+"-allowed"))
				out, _ := sh(t, inst, "tok-"+inst.ID, "", probes, time.Minute)
				if !strings.HasPrefix(out, "private 0 private\nmetadata 7 \npublic 0 public\ndns 198.18.0.99") {
					t.Errorf("from a sandbox with 10.201.0.0/24 allowed:\n%s", out)
				}
			})
		})
	}
}

// hostGet fetches from a test host from the host itself and returns the
// body, or the error.
func hostGet(addr string) string {
	c, err := net.DialTimeout("tcp4", addr, 4*time.Second)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(4 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return err.Error()
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return body
}
