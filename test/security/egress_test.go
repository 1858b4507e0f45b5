package security

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Attacks on egress policies, secrets and rules (issue 14): a policy
// never opens what the node refuses; a name an allowOut domain matches
// opens no other address; a team reaches nothing of another's; a secret
// value is never shown. Every probe's target is a test host on this
// machine, and its counter proves that nothing reached it.

// egressCall sends an API request as tm and returns the answer.
func egressCall(t *testing.T, tm team, method, path string, body any) apiResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := S.srv.call(ctx, tm, method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	checkErrorBody(t, r)
	return r
}

// curlIn runs curl in sb with args and returns its exit code and output.
func curlIn(t *testing.T, sb *sandbox, args string) (string, string) {
	t.Helper()
	r := sb.run(t, "user", "curl -sS --connect-timeout 3 -m 6 "+args+"; echo \" exit=$?\"")
	out := strings.TrimSpace(r.Stdout)
	i := strings.LastIndex(out, "exit=")
	if i < 0 {
		t.Fatalf("curl %s did not run: %s", args, r)
	}
	return out[i+len("exit="):], out[:i]
}

// mustReach checks that curl args gets the internet host's answer.
func mustReach(t *testing.T, sb *sandbox, args string) string {
	t.Helper()
	code, out := curlIn(t, sb, args)
	if code != "0" || !strings.Contains(out, "public-host") {
		t.Fatalf("curl %s: exit %s, %q: the policy does not let through what it allows, so its refusals prove nothing", args, code, out)
	}
	return out
}

// mustNotReach checks that curl args fails fast and that no test host
// server accepted a connection meanwhile (the internet host: no request).
func mustNotReach(t *testing.T, sb *sandbox, args string) {
	t.Helper()
	accepted, seen := S.hosts.accepted(), S.hosts.pubSeen.Load()
	code, out := curlIn(t, sb, args)
	switch {
	case code == "0" || strings.Contains(out, "-host"):
		t.Errorf("curl %s reached a test host: %q", args, out)
	case code == "28":
		t.Errorf("curl %s hung until its timeout: a refused connection must fail fast", args)
	}
	if n := S.hosts.accepted() - accepted; n != 0 {
		t.Errorf("curl %s: a test host accepted %d connections", args, n)
	}
	if n := S.hosts.pubSeen.Load() - seen; n != 0 {
		t.Errorf("curl %s: the internet host answered %d requests", args, n)
	}
}

func network(fields map[string]any) createOpts {
	return createOpts{Body: map[string]any{"network": fields}}
}

// A policy cannot allow what the node refuses: private, link-local and
// metadata addresses, the host itself, the egress proxy's own port; not
// by CIDR, not by IP, not by a domain that resolves there.
func TestEgressPolicyKeepsNodeRules(t *testing.T) {
	afterCase(t)
	if S.srv.egressPort == 0 {
		t.Skip("this build has no egress policies (no --egress-proxy-port)")
	}
	private := []any{"0.0.0.0/0", "10.0.0.0/8", "172.16.0.0/12", "169.254.0.0/16", "127.0.0.0/8", privHostAddr, metaHostAddr}
	for _, c := range []struct {
		name     string
		allowOut []any
	}{
		{"addresses only (the kernel judges)", private},
		{"with a domain (the proxy judges too)", append(private, "*.warren-sec.test")},
	} {
		t.Run(c.name, func(t *testing.T) {
			sb := mustCreate(t, S.teamA, network(map[string]any{"allowOut": c.allowOut}))
			mustReach(t, sb, fmt.Sprintf("http://%s:%d/", pubName, pubHostPort))
			gw := strings.TrimSpace(sb.ok(t, "user", `ip route | awk '/^default/ {print $3}'`))
			for _, target := range []string{
				fmt.Sprintf("http://%s:%d/", privHostAddr, privHostPort),
				fmt.Sprintf("http://%s:%d/", metaHostAddr, metaHostPort),
				fmt.Sprintf("http://%s:%d/", privName, privHostPort),
				fmt.Sprintf("http://%s:%d/", metaName, metaHostPort),
				fmt.Sprintf("http://%s:%d/", gw, S.srv.egressPort),
				fmt.Sprintf("http://127.0.0.1:%d/", S.srv.egressPort),
				fmt.Sprintf("http://%s:%d/", gw, S.srv.apiPort),
			} {
				mustNotReach(t, sb, target)
			}
		})
	}
}

// A name that an allowOut domain matches opens only the addresses that
// name resolves to: an HTTP Host or TLS SNI sent to another address, a
// forged /etc/hosts answer, a bare IP, bytes that are neither.
func TestEgressDomainSpoofing(t *testing.T) {
	afterCase(t)
	if S.srv.egressPort == 0 {
		t.Skip("this build has no egress policies (no --egress-proxy-port)")
	}
	sb := mustCreate(t, S.teamA, network(map[string]any{"allowOut": []any{pubName}, "denyOut": []any{"0.0.0.0/0"}}))
	mustReach(t, sb, fmt.Sprintf("http://%s:%d/", pubName, pubHostPort))
	for _, args := range []string{
		// The allowed name to private and metadata hosts.
		fmt.Sprintf("-H 'Host: %s' http://%s:%d/", pubName, privHostAddr, privHostPort),
		fmt.Sprintf("--resolve %s:%d:%s http://%s:%d/", pubName, metaHostPort, metaHostAddr, pubName, metaHostPort),
		fmt.Sprintf("-k --connect-to %s:443:%s:%d https://%s/", pubName, privHostAddr, privHostPort, pubName),
		// The internet host by its bare address, and by a name not allowed.
		fmt.Sprintf("http://%s:%d/", pubHostAddr, pubHostPort),
		fmt.Sprintf("-H 'Host: other.test' http://%s:%d/", pubHostAddr, pubHostPort),
		fmt.Sprintf("-k --connect-to other.test:443:%s:%d https://other.test/", pubHostAddr, pubHostPort),
	} {
		mustNotReach(t, sb, args)
	}
	// Bytes that are neither TLS nor HTTP go by the address rules: denied.
	seen := S.hosts.pubSeen.Load()
	r := sb.run(t, "user", fmt.Sprintf(`exec 3<>/dev/tcp/%s/%d || exit 0
printf 'GARBAGE %s\r\n\r\n' >&3; timeout 5 cat <&3; echo " exit=$?"`, pubHostAddr, pubHostPort, pubName))
	if strings.Contains(r.Stdout, "public-host") || S.hosts.pubSeen.Load() != seen {
		t.Errorf("raw bytes to a denied address got through: %s", r)
	}
	// A sandbox cannot talk to the proxy's port itself.
	plain := mustCreate(t, S.teamA, createOpts{})
	gw := strings.TrimSpace(plain.ok(t, "user", `ip route | awk '/^default/ {print $3}'`))
	mustNotReach(t, plain, fmt.Sprintf("http://%s:%d/", gw, S.srv.egressPort))
}

// Another team reaches nothing of a team's: not its secrets by ID or name,
// not its sandboxes' network settings or logs, not a secret's value
// through a rule of its own.
func TestEgressTeamScoping(t *testing.T) {
	afterCase(t)
	if S.srv.egressPort == 0 {
		t.Skip("this build has no egress policies (no --egress-proxy-port)")
	}
	canary := fmt.Sprintf("team-a-canary-%d", time.Now().UnixNano())
	name := fmt.Sprintf("sec-scope-%d", time.Now().UnixNano())
	r := egressCall(t, S.teamA, "POST", "/secrets", map[string]any{"name": name, "value": canary})
	if r.Status != http.StatusCreated && r.Status != http.StatusOK {
		t.Fatalf("creating a secret: %s", r)
	}
	var sec struct {
		SecretID string `json:"secretID"`
	}
	if err := r.decode(&sec); err != nil || sec.SecretID == "" {
		t.Fatalf("secret id: %v %s", err, r)
	}
	t.Cleanup(func() { egressCall(t, S.teamA, "DELETE", "/secrets/"+sec.SecretID, nil) })
	for _, ref := range []string{sec.SecretID, name} {
		for _, c := range []struct {
			method string
			body   any
		}{{"GET", nil}, {"POST", map[string]any{"value": "overwritten-by-b"}}, {"DELETE", nil}} {
			if r := egressCall(t, S.teamB, c.method, "/secrets/"+ref, c.body); r.Status != http.StatusNotFound {
				t.Errorf("team B %s /secrets/%s of team A: %s", c.method, ref, r)
			}
		}
	}
	if r := egressCall(t, S.teamB, "GET", "/secrets?limit=100", nil); strings.Contains(string(r.Body), name) {
		t.Errorf("team B lists team A's secret: %s", r)
	}
	sbA := mustCreate(t, S.teamA, createOpts{})
	for _, c := range []struct{ method, path string }{
		{"PUT", "/sandboxes/" + sbA.ID + "/network"},
		{"GET", "/v2/sandboxes/" + sbA.ID + "/logs?source=network"},
	} {
		var body any
		if c.method == "PUT" {
			body = map[string]any{"allowOut": []any{}, "denyOut": []any{"0.0.0.0/0"}}
		}
		if r := egressCall(t, S.teamB, c.method, c.path, body); r.Status != http.StatusNotFound {
			t.Errorf("team B %s %s of team A's sandbox: %s", c.method, c.path, r)
		}
	}
	// Team A's secret is still its own, unchanged.
	if r := egressCall(t, S.teamA, "GET", "/secrets/"+name, nil); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"currentVersion":1`) && !strings.Contains(string(r.Body), `"version":1`) {
		t.Errorf("team A's secret after team B's attempts: %s", r)
	}
	// Team B names team A's secret in a rule: it never gets the value.
	rules := map[string]any{pubName: []any{map[string]any{"transform": map[string]any{"headers": map[string]any{"X-Stolen": "${e2b.secrets." + name + "}"}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sbB, err := S.createSandbox(ctx, S.teamB, network(map[string]any{"allowOut": []any{pubName}, "rules": rules}))
	if err != nil {
		return // refused at create: nothing to steal
	}
	t.Cleanup(func() { killSandbox(t, sbB) })
	_, out := curlIn(t, sbB, fmt.Sprintf("http://%s:%d/", pubName, pubHostPort))
	if strings.Contains(out, canary) {
		t.Errorf("team B's rule sent team A's secret: %q", out)
	}
}

// A secret's value is never shown: not by the API (answers, errors),
// not inside the sandbox whose requests carry it, not in the server's
// log or audit; the database holds it sealed only, under a 0600 key.
func TestSecretValueNeverShown(t *testing.T) {
	afterCase(t)
	if S.srv.egressPort == 0 {
		t.Skip("this build has no secrets (no --egress-proxy-port)")
	}
	canary := fmt.Sprintf("never-shown-%d", time.Now().UnixNano())
	name := fmt.Sprintf("sec-shown-%d", time.Now().UnixNano())
	var answers []string
	r := egressCall(t, S.teamA, "POST", "/secrets", map[string]any{"name": name, "value": canary, "metadata": map[string]any{"k": "v"}})
	answers = append(answers, string(r.Body))
	t.Cleanup(func() { egressCall(t, S.teamA, "DELETE", "/secrets/"+name, nil) })
	for _, body := range []any{
		map[string]any{"name": name, "value": canary},                      // 409: the name is taken
		map[string]any{"name": "bad name!", "value": canary},               // 400: the name
		map[string]any{"name": name + "x", "value": canary, "metadata": 1}, // 400: the metadata
		map[string]any{"name": name + "y", "value": strings.Repeat(canary, 8000)},
	} {
		r := egressCall(t, S.teamA, "POST", "/secrets", body)
		if r.Status < 400 {
			t.Errorf("a bad secret was accepted: %s", r)
		}
		answers = append(answers, string(r.Body))
	}
	for _, p := range []string{"/secrets/" + name, "/secrets?limit=100"} {
		answers = append(answers, string(egressCall(t, S.teamA, "GET", p, nil).Body))
	}
	rules := map[string]any{pubName: []any{map[string]any{"transform": map[string]any{"headers": map[string]any{"Authorization": "Bearer ${e2b.secrets." + name + "}"}}}}}
	sb := mustCreate(t, S.teamA, network(map[string]any{"allowOut": []any{pubName}, "denyOut": []any{"0.0.0.0/0"}, "rules": rules}))
	out := mustReach(t, sb, fmt.Sprintf("http://%s:%d/", pubName, pubHostPort))
	if !strings.Contains(out, "Bearer "+canary) {
		t.Fatalf("the rule did not put the secret into the request (the checks below would prove nothing): %q", out)
	}
	// The script must not carry the value itself (its command line would
	// show it): the files are searched with a pattern file outside them.
	inside := sb.run(t, "root", `env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n'`)
	if strings.Contains(inside.Stdout, canary) {
		t.Error("the sandbox sees the secret's value in an environment or command line")
	}
	pattern := "/var/tmp/sec-pattern"
	half := len(canary) / 2
	sb.ok(t, "root", fmt.Sprintf("printf '%%s%%s' '%s' '%s' > %s", canary[:half], canary[half:], pattern))
	if files := sb.run(t, "root", `grep -rlsF -f `+pattern+` /etc /tmp /run /root /home; true`); strings.TrimSpace(files.Stdout) != "" {
		t.Errorf("files in the sandbox hold the secret's value: %s", files.Stdout)
	}
	answers = append(answers, string(egressCall(t, S.teamA, "GET", "/sandboxes/"+sb.ID, nil).Body))
	answers = append(answers, string(egressCall(t, S.teamA, "GET", "/v2/sandboxes/"+sb.ID+"/logs?source=network", nil).Body))
	for _, a := range answers {
		if strings.Contains(a, canary) {
			t.Errorf("an API answer shows the value: %.300s", a)
		}
	}
	if strings.Contains(S.srv.logText(), canary) {
		t.Error("the server's log holds the value")
	}
	// Nothing in the data dir holds it in clear (but the sandboxes' own
	// trees, which never get it either and are too big to read here).
	filepath.WalkDir(S.srv.dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && (d.Name() == "layers" || d.Name() == "sandboxes" || d.Name() == "images") {
			return fs.SkipDir
		}
		if info, err := d.Info(); err == nil && d.Type().IsRegular() && info.Size() < 64<<20 {
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), canary) {
				t.Errorf("%s holds the secret in clear", p)
			}
		}
		return nil
	})
	if fi, err := os.Stat(filepath.Join(S.srv.dataDir, "secret.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the node key: %v, %v (want mode 0600)", fi, err)
	}
}

// Bad egress settings are refused with a 400 that names what is wrong,
// on create and on PUT /sandboxes/{id}/network; a policy is bounded.
func TestEgressBadInput(t *testing.T) {
	afterCase(t)
	if S.srv.egressPort == 0 {
		t.Skip("this build has no egress policies (no --egress-proxy-port)")
	}
	many := make([]any, 5000)
	for i := range many {
		many[i] = fmt.Sprintf("203.0.%d.%d/32", i>>8&255, i&255)
	}
	domains := make([]any, 600)
	for i := range domains {
		domains[i] = fmt.Sprintf("d%d.example.test", i)
	}
	header := func(name, value string) map[string]any {
		return map[string]any{pubName: []any{map[string]any{"transform": map[string]any{"headers": map[string]any{name: value}}}}}
	}
	cases := []struct {
		name  string
		net   map[string]any
		names string // the message names this
	}{
		{"a domain in denyOut", map[string]any{"denyOut": []any{"evil.example.com"}}, "evil.example.com"},
		{"a bad CIDR", map[string]any{"allowOut": []any{"300.1.2.3/8"}}, "300.1.2.3"},
		{"a bad wildcard", map[string]any{"allowOut": []any{"*.*.example.com"}}, "*.*.example.com"},
		{"too many ranges", map[string]any{"allowOut": many}, "at most"},
		{"too many domains", map[string]any{"allowOut": domains}, "at most"},
		{"a header name with CRLF", map[string]any{"rules": header("X-A\r\nX-Injected", "v")}, "header"},
		{"a header value with CRLF", map[string]any{"rules": header("X-A", "v\r\nX-Injected: 1")}, "header"},
		{"a bad secret name", map[string]any{"rules": header("X-A", "${e2b.secrets.../x}")}, "secret"},
		{"an egressProxy at loopback", map[string]any{"egressProxy": map[string]any{"address": "127.0.0.1:3128"}}, "egressProxy"},
		{"an egressProxy at a private host", map[string]any{"egressProxy": map[string]any{"address": fmt.Sprintf("%s:%d", privHostAddr, privHostPort)}}, "egressProxy"},
		{"an egressProxy at the metadata host", map[string]any{"egressProxy": map[string]any{"address": metaName + ":80"}}, "egressProxy"},
		{"an egressProxy without a port", map[string]any{"egressProxy": map[string]any{"address": pubHostAddr}}, "egressProxy"},
	}
	sb := mustCreate(t, S.teamA, createOpts{})
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		got, err := S.createSandbox(ctx, S.teamA, network(c.net))
		cancel()
		if err == nil {
			killSandbox(t, got)
			t.Errorf("create with %s: accepted", c.name)
		} else if se, ok := err.(*statusError); !ok || se.r.Status != http.StatusBadRequest || !strings.Contains(string(se.r.Body), c.names) {
			t.Errorf("create with %s: %v, want a 400 naming %q", c.name, err, c.names)
		} else {
			checkErrorBody(t, se.r)
		}
		r := egressCall(t, S.teamA, "PUT", "/sandboxes/"+sb.ID+"/network", c.net)
		if r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), c.names) {
			t.Errorf("PUT network with %s: %s, want a 400 naming %q", c.name, r, c.names)
		}
	}
	if r := egressCall(t, S.teamA, "PUT", "/sandboxes/nosuchsandbox/network", map[string]any{}); r.Status != http.StatusNotFound {
		t.Errorf("PUT network of no sandbox: %s", r)
	}
	// The sandbox kept its (open) egress through all of that.
	mustReach(t, sb, fmt.Sprintf("http://%s:%d/", pubHostAddr, pubHostPort))
	var info struct {
		AllowInternetAccess *bool           `json:"allowInternetAccess"`
		Network             json.RawMessage `json:"network"`
	}
	if err := egressCall(t, S.teamA, "GET", "/sandboxes/"+sb.ID, nil).decode(&info); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(info.Network), "0.0.0.0/0") {
		t.Errorf("a refused update changed the policy: %s", info.Network)
	}
}
