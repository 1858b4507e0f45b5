package security

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/envdinfo"
)

// probeScript tries a TCP connection (an HTTP GET) to each address and
// prints "<addr> exit=<curl's exit code>": 7 is a refused or unreachable
// connection, 28 a timeout (a silently dropped packet), 0 an answer.
func probeScript(addrs []string) string {
	return `for a in ` + strings.Join(addrs, " ") + `; do
  curl -s -o /dev/null --connect-timeout 3 -m 5 "http://$a/"; echo "$a exit=$?"
done`
}

// probe runs the probes from sb and returns each address's curl exit.
func probe(t *testing.T, sb *sandbox, addrs []string) map[string]string {
	t.Helper()
	r := sb.run(t, "user", probeScript(addrs))
	out := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if a, code, ok := strings.Cut(l, " exit="); ok {
			out[a] = code
		}
	}
	if len(out) != len(addrs) {
		t.Fatalf("the probes did not run: %s", r)
	}
	return out
}

// mustFailFast checks that every probe was refused at once: no answer,
// and no wait for a timeout.
func mustFailFast(t *testing.T, what string, got map[string]string) {
	t.Helper()
	for a, code := range got {
		switch code {
		case "7":
		case "0":
			t.Errorf("%s: the sandbox reached %s", what, a)
		case "28":
			t.Errorf("%s: %s is dropped silently (curl timed out): a refused connection must fail fast", what, a)
		default:
			t.Errorf("%s: %s: curl exit %s, want 7 (refused or unreachable)", what, a, code)
		}
	}
}

// uplinkAddrs is the IPv4 addresses of the interfaces that carry a
// default route.
func uplinkAddrs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	seen := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 8 || f[1] != "00000000" || f[7] != "00000000" || seen[f[0]] {
			continue
		}
		seen[f[0]] = true
		ifc, err := net.InterfaceByName(f[0])
		if err != nil {
			t.Fatal(err)
		}
		as, err := ifc.Addrs()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				out = append(out, ipn.IP.String())
			}
		}
	}
	if len(out) == 0 {
		t.Log("this host has no default route: only the sandbox's gateway is probed")
	}
	return out
}

// sandboxIP is sb's eth0 address.
func sandboxIP(t *testing.T, sb *sandbox) string {
	t.Helper()
	out := sb.ok(t, "user", `ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1`)
	ip := strings.TrimSpace(out)
	if net.ParseIP(ip) == nil {
		t.Fatalf("cannot read the sandbox's address: %q", out)
	}
	return ip
}

func TestSandboxReachesHost(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	gw := strings.TrimSpace(sb.ok(t, "user", `ip route | awk '/^default/ {print $3}'`))
	addrs := []string{
		fmt.Sprintf("%s:%d", gw, S.srv.apiPort),
		fmt.Sprintf("%s:%d", gw, S.srv.proxyPort),
		fmt.Sprintf("%s:%d", gw, S.hostService.port),
	}
	// The host's uplink addresses, where a service listening on all
	// addresses is. Only the uplink's: other tests running beside this
	// suite add and remove their own interfaces meanwhile.
	for _, ip := range uplinkAddrs(t) {
		addrs = append(addrs, fmt.Sprintf("%s:%d", ip, S.hostService.port))
	}
	before := S.hostService.accepted.Load()
	mustFailFast(t, "sandbox → host", probe(t, sb, addrs))
	if n := S.hostService.accepted.Load() - before; n > 0 {
		t.Errorf("the host service accepted %d connections from a sandbox", n)
	}
}

func TestSandboxReachesAnotherSandbox(t *testing.T) {
	afterCase(t)
	other := mustCreate(t, S.teamB, createOpts{})
	serveIn(t, other, 8000, "other-sandbox")
	sb := mustCreate(t, S.teamA, createOpts{})
	otherIP, witnessIP := sandboxIP(t, other), sandboxIP(t, S.witness)
	mustFailFast(t, "sandbox → sandbox", probe(t, sb, []string{
		otherIP + ":8000", fmt.Sprintf("%s:%d", otherIP, envdinfo.Port), fmt.Sprintf("%s:%d", witnessIP, envdinfo.Port),
	}))
}

func TestSandboxReachesPrivateRanges(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	before := S.hosts.accepted()
	mustFailFast(t, "sandbox → private and link-local ranges", probe(t, sb, []string{
		fmt.Sprintf("%s:%d", privHostAddr, privHostPort),
		fmt.Sprintf("%s:%d", metaHostAddr, metaHostPort),
		// The resolver is allowed on port 53 only.
		fmt.Sprintf("%s:%d", dnsHostAddr, dnsOtherPort),
	}))
	if n := S.hosts.accepted() - before; n > 0 {
		t.Errorf("the test hosts accepted %d connections from a sandbox", n)
	}
}

func TestDNSThroughConfiguredResolver(t *testing.T) {
	requireFlag(t, "resolv-conf", "DNS under the default egress deny (sandboxes use --resolv-conf's resolvers)")
	t.Run("in a sandbox", func(t *testing.T) {
		afterCase(t)
		sb := mustCreate(t, S.teamA, createOpts{})
		conf := sb.ok(t, "user", "grep '^nameserver' /etc/resolv.conf")
		if strings.TrimSpace(conf) != "nameserver "+dnsHostAddr {
			t.Errorf("the sandbox's resolv.conf lists %q, want exactly the configured resolver %s", conf, dnsHostAddr)
		}
		r := sb.run(t, "user", "getent ahostsv4 "+dnsName)
		if r.Exit != 0 || !strings.Contains(r.Stdout, dnsAnswer) {
			t.Errorf("%s does not resolve in a sandbox: %s", dnsName, r)
		}
	})
	t.Run("in a template build step", func(t *testing.T) {
		afterCase(t)
		b := linkTemplate(t, S.teamA, "sec-dns-build", "getent ahostsv4 "+dnsName)
		if b.Err != nil {
			t.Fatalf("%s does not resolve in a build step: %v\n%s", dnsName, b.Err, b.log())
		}
		defer removeLayers(t, ownLayers(t, b.BuildID))
		if !strings.Contains(b.stepLogs("1"), dnsAnswer) {
			t.Errorf("the build step did not resolve %s:\n%s", dnsName, b.stepLogs("1"))
		}
	})
}
