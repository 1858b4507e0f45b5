package security

// Issue 12: what the HTTPS proxy, the routing of signed URLs and the end
// of a killed sandbox's streams add to what a tenant can reach.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/filesig"
)

// clientFrom is an HTTP client whose connections come from a loopback
// address of their own, so that the failure budget it spends is not the
// rest of the suite's (the proxy counts wrong credentials per address).
func clientFrom(addr string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(addr)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// signedURL is what the SDK's downloadUrl() gives with E2B_SANDBOX_URL set:
// a /files URL of the proxy itself, signed with a sandbox's envd token.
func signedURL(token, path, op, user string) string {
	v := url.Values{"path": {path}, "signature": {filesig.Signature(path, op, user, token, nil)}}
	if user != "" {
		v.Set("username", user)
	}
	return S.srv.proxyURL + "/files?" + v.Encode()
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	res, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res.StatusCode, string(b)
}

// TestSignedURLsWithoutASandboxID: a signed URL reaches only the sandbox
// whose token made it; nothing an attacker changes in one, nor any
// signature it makes up, reaches another team's sandbox or tells it which
// sandboxes exist; and guessing is cut off by the address's budget.
func TestSignedURLsWithoutASandboxID(t *testing.T) {
	afterCase(t)
	victim := mustCreate(t, S.teamB, createOpts{})
	attacker := mustCreate(t, S.teamA, createOpts{})
	victim.ok(t, "user", "echo victim-secret > /tmp/s.txt")
	attacker.ok(t, "user", "echo attacker-own > /tmp/s.txt")
	c := clientFrom("127.0.0.23")

	if status, body := get(t, c, signedURL(attacker.EnvdToken, "/tmp/s.txt", "read", "")); status != 200 || body != "attacker-own\n" {
		t.Fatalf("control: the attacker's own signed URL: %d %q", status, body)
	}
	own := signedURL(attacker.EnvdToken, "/tmp/s.txt", "read", "")
	for name, u := range map[string]string{
		"its own signature, as root":      own + "&username=root",
		"its own signature, another path": strings.Replace(own, "%2Ftmp%2Fs.txt", "%2Fetc%2Fshadow", 1),
		"a signature made with no token":  signedURL("", "/tmp/s.txt", "read", ""),
		"the victim's ID as a token":      signedURL(victim.ID, "/tmp/s.txt", "read", ""),
		"a traffic token as envd's":       signedURL(victim.TrafficToken, "/tmp/s.txt", "read", ""),
		"an empty signature":              S.srv.proxyURL + "/files?path=%2Ftmp%2Fs.txt&signature=",
		"a signature that is not base64":  S.srv.proxyURL + "/files?path=%2Ftmp%2Fs.txt&signature=v1_%00%ff",
	} {
		status, body := get(t, c, u)
		if status == 200 || strings.Contains(body, "victim-secret") || strings.Contains(body, victim.ID) {
			t.Errorf("%s: %d %s", name, status, body)
		}
		if status == 401 && strings.TrimSpace(body) != `{"code":401,"message":"invalid signature"}` {
			t.Errorf("%s: the refusal says more than that the signature is invalid: %s", name, body)
		}
	}
	// A second path is ignored by the proxy and by envd alike: the first,
	// the signed one, is read.
	if status, body := get(t, c, own+"&path=%2Fetc%2Fshadow"); status != 200 || body != "attacker-own\n" {
		t.Errorf("a signed URL with a second path: %d %q", status, body)
	}

	// Guessing: at most the budget's worth of signatures is even looked
	// at from one address, then further failures get 429; a genuine URL
	// is still served (behind a load balancer every client shares the
	// address: failures must not lock the others out).
	g := clientFrom("127.0.0.24")
	limited := false
	for i := range 40 {
		status, _ := get(t, g, signedURL(fmt.Sprintf("guess-%d", i), "/tmp/s.txt", "read", ""))
		if status == 429 {
			limited = true
			break
		}
		if status != 401 {
			t.Fatalf("guess %d: %d", i, status)
		}
	}
	if !limited {
		t.Error("40 forged signatures from one address and no 429")
	}
	if status, _ := get(t, g, signedURL(victim.EnvdToken, "/tmp/s.txt", "read", "")); status != 200 {
		t.Errorf("past the budget a genuine URL got %d, want 200", status)
	}
	if status, _ := get(t, g, signedURL("guess-after", "/tmp/s.txt", "read", "")); status != 429 {
		t.Errorf("past the budget, after a genuine URL, a forged one got %d, want 429", status)
	}
}

// TestHTTPSProxy: the HTTPS proxy routes, guards and refuses as the plain
// one does; its local CA's key is kept from other users; nothing is signed
// for names outside the domain.
func TestHTTPSProxy(t *testing.T) {
	requireFlag(t, "proxy-tls-addr", "HTTPS sandbox URLs (issue 12)")
	afterCase(t)
	dir := filepath.Join(S.srv.dataDir, "ingress", "localhost")
	if fi, err := os.Stat(filepath.Join(dir, "ca-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the local CA's key: %v %v", fi, err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", S.srv.tlsAddr)
		},
		ForceAttemptHTTP2: true,
	}}

	victim := mustCreate(t, S.teamB, createOpts{Private: true})
	serveIn(t, victim, 8000, "victim-content")
	fetch := func(host, token string) (int, string) {
		req, _ := http.NewRequest("GET", "https://"+host+"/", nil)
		if token != "" {
			req.Header.Set("e2b-traffic-access-token", token)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET https://%s/: %v", host, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if status, body := fetch(host(8000, victim.ID), victim.TrafficToken); status != 200 || !strings.Contains(body, "victim-content") {
		t.Fatalf("control: %d %s", status, body)
	}
	for name, token := range map[string]string{"no token": "", "a wrong token": "guess", "its envd token": victim.EnvdToken} {
		if status, body := fetch(host(8000, victim.ID), token); status != 403 || strings.Contains(body, "victim-content") {
			t.Errorf("%s over HTTPS: %d %s", name, status, body)
		}
	}
	// Handshakes for names outside the domain get no certificate at all.
	for _, name := range []string{"example.com", "8000-" + victim.ID + ".localhost.evil.example", "a.b.localhost"} {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", S.srv.tlsAddr, &tls.Config{ServerName: name, InsecureSkipVerify: true})
		if err == nil {
			conn.Close()
			t.Errorf("a certificate was served for %s", name)
		}
	}
}

// TestKilledSandboxStreamsEnd: a stream to a killed sandbox is ended by
// the proxy, not left open for whoever holds it (a connection the host
// kept to a released address would otherwise point at its next holder).
func TestKilledSandboxStreamsEnd(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	// A port that streams forever.
	sb.ok(t, "user", `cat > /tmp/stream.py <<'EOF'
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
        while True:
            self.wfile.write(b"tick\n"); self.wfile.flush(); time.sleep(0.2)
http.server.ThreadingHTTPServer(("0.0.0.0", 8001), H).serve_forever()
EOF
(nohup python3 /tmp/stream.py >/dev/null 2>&1 &)
for i in $(seq 100); do curl -s -m 1 -o /dev/null http://127.0.0.1:8001/ ; [ $? -eq 28 ] && exit 0; sleep 0.1; done; exit 1`)
	req, _ := http.NewRequest("GET", S.srv.proxyURL+"/", nil)
	req.Host = host(8001, sb.ID)
	res, err := (&http.Client{}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(res.Body, buf); err != nil || string(buf) != "tick\n" {
		t.Fatalf("stream: %q %v", buf, err)
	}
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, res.Body); ended <- err }()
	killSandbox(t, sb)
	select {
	case err := <-ended:
		if err == nil {
			t.Error("the stream of a killed sandbox ended as if it were complete")
		}
	case <-time.After(20 * time.Second):
		t.Error("the stream of a killed sandbox is still open 20 s later")
	}
}
