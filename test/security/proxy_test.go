package security

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/poll"
)

// proxyGet sends GET path to the sandbox proxy with the given Host and
// headers (name, value pairs).
func proxyGet(t *testing.T, host, path string, headers ...string) apiResponse {
	t.Helper()
	req, err := http.NewRequest("GET", S.srv.proxyURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", path, host, err)
	}
	noInternalsIn(t, r)
	return r
}

// noInternalsIn fails the test if a proxy error body tells the client the
// host's side: sandbox addresses, the data dir, runtime errors.
func noInternalsIn(t *testing.T, r apiResponse) {
	t.Helper()
	if r.Status < 400 {
		return
	}
	for _, leak := range []string{"10.127.", S.srv.dataDir, S.srv.runDir, "runsc", "dial tcp", "read tcp"} {
		if strings.Contains(string(r.Body), leak) {
			t.Errorf("a proxy error body tells the host's internals (%q): %s", leak, r)
		}
	}
}

// serveIn starts an HTTP server on port in sb that answers body.
func serveIn(t *testing.T, sb *sandbox, port int, body string) {
	t.Helper()
	sb.ok(t, "user", fmt.Sprintf(`mkdir -p /tmp/www%d && echo %s > /tmp/www%d/index.html && cd /tmp/www%d && (nohup python3 -m http.server %d >/dev/null 2>&1 &)
for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:%d/ && exit 0; sleep 0.1; done; exit 1`, port, body, port, port, port, port))
}

func host(port int, id string) string { return fmt.Sprintf("%d-%s.localhost", port, id) }

func TestProxyHostTricks(t *testing.T) {
	afterCase(t)
	victim := mustCreate(t, S.teamB, createOpts{Private: true})
	attacker := mustCreate(t, S.teamA, createOpts{Private: true})
	if victim.TrafficToken == "" || attacker.TrafficToken == "" {
		t.Fatal("private sandboxes have no traffic tokens")
	}
	serveIn(t, victim, 8000, "victim-content")
	tok := "e2b-traffic-access-token"

	t.Run("control: the victim's own token", func(t *testing.T) {
		if r := proxyGet(t, host(8000, victim.ID), "/", tok, victim.TrafficToken); r.Status != 200 || !strings.Contains(string(r.Body), "victim-content") {
			t.Fatalf("the victim's port is not reachable with its own token: %s", r)
		}
	})
	t.Run("another sandbox's ID with your traffic token", func(t *testing.T) {
		for _, r := range []apiResponse{
			proxyGet(t, host(8000, victim.ID), "/", tok, attacker.TrafficToken),
			proxyGet(t, "localhost", "/", "E2b-Sandbox-Id", victim.ID, "E2b-Sandbox-Port", "8000", tok, attacker.TrafficToken),
			proxyGet(t, host(8000, attacker.ID), "/", "E2b-Sandbox-Id", victim.ID, "E2b-Sandbox-Port", "8000", tok, attacker.TrafficToken),
			proxyGet(t, host(8000, victim.ID), "/"),
		} {
			if r.Status != http.StatusForbidden || strings.Contains(string(r.Body), "victim-content") {
				t.Errorf("reached the victim's port without its token: %s", r)
			}
		}
	})
	t.Run("ports 0 and 65536", func(t *testing.T) {
		for _, p := range []string{"0", "65536", "-1", "99999999999999999999"} {
			for _, r := range []apiResponse{
				proxyGet(t, p+"-"+victim.ID+".localhost", "/", tok, victim.TrafficToken),
				proxyGet(t, "localhost", "/", "E2b-Sandbox-Id", victim.ID, "E2b-Sandbox-Port", p, tok, victim.TrafficToken),
			} {
				if r.Status != http.StatusBadRequest {
					t.Errorf("port %s: %s, want 400", p, r)
				}
			}
		}
	})
	t.Run("envd's port with only a traffic token", func(t *testing.T) {
		for _, r := range []apiResponse{
			proxyGet(t, host(envdinfo.Port, victim.ID), "/envs", tok, victim.TrafficToken),
			proxyGet(t, host(envdinfo.Port, victim.ID), "/envs", tok, attacker.TrafficToken),
			proxyGet(t, "localhost", "/files?path=/etc/hostname", "E2b-Sandbox-Id", victim.ID, "E2b-Sandbox-Port", strconv.Itoa(envdinfo.Port), tok, victim.TrafficToken),
		} {
			if r.Status != http.StatusUnauthorized {
				t.Errorf("envd answered a request with a traffic token but no access token: %s, want 401", r)
			}
		}
	})
	t.Run("the API's and the proxy's own ports as a sandbox port", func(t *testing.T) {
		for _, p := range []int{S.srv.apiPort, S.srv.proxyPort} {
			r := proxyGet(t, host(p, victim.ID), "/health", tok, victim.TrafficToken)
			if r.Status == http.StatusOK || strings.Contains(string(r.Body), `"status"`) {
				t.Errorf("port %d of the sandbox reached the host's own service: %s", p, r)
			}
			if r.Status != http.StatusBadGateway {
				t.Errorf("port %d (closed in the sandbox): %s, want 502", p, r)
			}
		}
	})
	t.Run("unknown sandbox IDs", func(t *testing.T) {
		for _, h := range []string{host(8000, "nosuchsandbox0000000"), "8000-127.0.0.1", host(8000, S.witness.ID[:6]), "8000-..", "8000-" + victim.ID + "x.localhost"} {
			r := proxyGet(t, h, "/", tok, victim.TrafficToken)
			if r.Status != http.StatusBadGateway && r.Status != http.StatusBadRequest {
				t.Errorf("Host %s: %s, want 502 (not found) or 400", h, r)
			}
		}
		// Host names are case-insensitive: an upper-case ID may name the
		// victim, but not without its token.
		if r := proxyGet(t, host(8000, strings.ToUpper(victim.ID)), "/", tok, attacker.TrafficToken); r.Status < 400 || strings.Contains(string(r.Body), "victim-content") {
			t.Errorf("the victim's ID in upper case with another's token: %s", r)
		}
	})
	t.Run("an upstream that breaks the connection", func(t *testing.T) {
		// A server that accepts and resets: the proxy's error must not
		// carry the transport's error, which names host-side addresses.
		victim.ok(t, "user", `(nohup python3 -c '
import socket, struct
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 8001)); s.listen(16)
while True:
    c, _ = s.accept(); c.recv(1); c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
' >/dev/null 2>&1 &) ; sleep 0.5`)
		r := proxyGet(t, host(8001, victim.ID), "/", tok, victim.TrafficToken)
		if r.Status < 500 {
			t.Errorf("a broken upstream: %s, want a 5xx", r)
		}
	})
}

// Traffic to a paused sandbox that resumes on traffic must be refused
// for its token before the sandbox is resumed.
func TestProxyResumesPausedSandboxBeforeTokenCheck(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{Private: true, AutoPause: true, AutoResume: true, Timeout: 2})
	state := func() string {
		r, err := S.srv.call(context.Background(), S.teamA, "GET", "/sandboxes/"+sb.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			State string `json:"state"`
		}
		r.decode(&d)
		return d.State
	}
	if !poll.Within(20*time.Second, 200*time.Millisecond, func() bool { return state() == "paused" }) {
		t.Fatalf("the sandbox did not pause after its timeout: %s", state())
	}
	r := proxyGet(t, host(8000, sb.ID), "/")
	if r.Status != http.StatusForbidden {
		t.Errorf("traffic without the traffic token to a paused sandbox: %s, want 403", r)
	}
	if st := state(); st != "paused" {
		t.Errorf("traffic without the traffic token resumed the sandbox (now %s)", st)
	}
}

// A paused sandbox is removed after the retention (--paused-retention):
// paused sandboxes do not pile up on the node.
func TestPausedSandboxIsReaped(t *testing.T) {
	requireFlag(t, "paused-retention", "paused sandboxes never reaped")
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{AutoPause: true, Timeout: 1})
	var r apiResponse
	gone := poll.Within(pausedRetention+30*time.Second, 500*time.Millisecond, func() bool {
		var err error
		if r, err = S.srv.call(context.Background(), S.teamA, "GET", "/sandboxes/"+sb.ID, nil); err != nil {
			t.Fatal(err)
		}
		return r.Status == http.StatusNotFound
	})
	if !gone {
		t.Fatalf("the paused sandbox is still there %s after its timeout (retention %s): %s", pausedRetention+30*time.Second, pausedRetention, r)
	}
	// killSandbox checks that nothing of it is left.
}
