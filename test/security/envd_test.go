package security

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envdinfo"
	fspb "github.com/warren-sandbox/warren/proto/envd/filesystem"
	"github.com/warren-sandbox/warren/proto/envd/filesystem/filesystemconnect"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// sdkSignature is the E2B SDK's signature of a pre-signed /files URL:
// "v1_" + unpadded base64 of SHA-256 over
// "<path>:<operation>:<user>:<token>:<expiration>".
func sdkSignature(path, operation, user, token string, expiration int64) string {
	sum := sha256.Sum256([]byte(path + ":" + operation + ":" + user + ":" + token + ":" + strconv.FormatInt(expiration, 10)))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// envdHTTP sends a plain HTTP request to sb's envd through the proxy.
func envdHTTP(t *testing.T, sb *sandbox, method, pathAndQuery, token, body string) apiResponse {
	t.Helper()
	req, err := http.NewRequest(method, S.srv.proxyURL+pathAndQuery, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	envdHeaders(req.Header, sb.ID, token, "")
	switch {
	case strings.HasPrefix(pathAndQuery, "/files?"):
		req.Header.Set("Content-Type", "application/octet-stream")
	case body != "":
		req.Header.Set("Content-Type", "application/json")
	}
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A signed write URL for one file is for that one upload; it must not
// unlock /files/compose, which moves any file as any user.
func TestComposeThroughSignedWriteURL(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	sb.ok(t, "root", "echo root-only-secret > /root/secret && chmod 600 /root/secret")
	exp := time.Now().Add(time.Minute).Unix()
	path := "/home/user/upload.txt"
	q := "?" + query("path", path, "username", "user",
		"signature", sdkSignature(path, "write", "user", sb.EnvdToken, exp), "signature_expiration", strconv.FormatInt(exp, 10))
	// Control: the URL is good for the upload it was signed for.
	up := envdHTTP(t, sb, "POST", "/files"+q, "", "uploaded")
	if up.Status != http.StatusOK {
		t.Fatalf("control failed: the signed upload URL does not upload: %s", up)
	}
	body := `{"source_paths":["/root/secret"],"destination":"/home/user/stolen","username":"root"}`
	r := envdHTTP(t, sb, "POST", "/files/compose"+q, "", body)
	if r.Status != http.StatusUnauthorized {
		t.Errorf("/files/compose accepted a signed write URL: %s", r)
	}
	if got := sb.run(t, "root", "cat /root/secret"); got.Stdout != "root-only-secret\n" {
		t.Errorf("compose through the signed URL moved /root/secret: %s", got)
	}
}

// envdRoute is one envd endpoint, called with a token.
type envdRoute struct {
	name string
	call func(ctx context.Context, token string) error
}

// httpStatusError is a plain HTTP route's answer.
type httpStatusError struct{ status int }

func (e httpStatusError) Error() string { return fmt.Sprintf("HTTP %d", e.status) }

// unauthorized tells whether an envd call was refused for its token.
func unauthorized(err error) bool {
	var he httpStatusError
	if errors.As(err, &he) {
		return he.status == http.StatusUnauthorized
	}
	return connect.CodeOf(err) == connect.CodeUnauthenticated
}

// unaryRoute is the unary RPC call of envd, called with msg.
func unaryRoute[Req, Res any](sb *sandbox, name string, call func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error), msg *Req) envdRoute {
	return envdRoute{name, func(ctx context.Context, token string) error {
		r := connect.NewRequest(msg)
		envdHeaders(r.Header(), sb.ID, token, "user")
		_, err := call(ctx, r)
		return err
	}}
}

// serverStreamRoute is the server-streaming RPC call of envd, called with
// msg and read to its end, for at most timeout.
func serverStreamRoute[Req, Res any](sb *sandbox, name string, call func(context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Res], error), msg *Req, timeout time.Duration) envdRoute {
	return envdRoute{name, func(ctx context.Context, token string) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		r := connect.NewRequest(msg)
		envdHeaders(r.Header(), sb.ID, token, "user")
		st, err := call(ctx, r)
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
		}
		return st.Err()
	}}
}

// envdRoutes are all of envd's routes but /health, with harmless
// arguments: on a build that lets them through they must not hurt.
func envdRoutes(sb *sandbox) []envdRoute {
	fs := filesystemconnect.NewFilesystemClient(proxyClient, S.srv.proxyURL)
	pc := processconnect.NewProcessClient(proxyClient, S.srv.proxyURL)
	nobody := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}
	// stream is a streaming RPC called by hand: f sets the headers with h.
	stream := func(name string, f func(ctx context.Context, h func(http.Header)) error) envdRoute {
		return envdRoute{name, func(ctx context.Context, token string) error {
			return f(ctx, func(h http.Header) { envdHeaders(h, sb.ID, token, "user") })
		}}
	}
	plain := func(method, pathAndQuery, body string) envdRoute {
		return envdRoute{method + " " + strings.SplitN(pathAndQuery, "?", 2)[0], func(ctx context.Context, token string) error {
			r, err := http.NewRequestWithContext(ctx, method, S.srv.proxyURL+pathAndQuery, strings.NewReader(body))
			if err != nil {
				return err
			}
			envdHeaders(r.Header, sb.ID, token, "")
			res, err := do(r)
			if err != nil {
				return err
			}
			if res.Status >= 300 {
				return httpStatusError{res.Status}
			}
			return nil
		}}
	}
	return []envdRoute{
		unaryRoute(sb, "Filesystem.Stat", fs.Stat, &fspb.StatRequest{Path: "/etc/hostname"}),
		unaryRoute(sb, "Filesystem.MakeDir", fs.MakeDir, &fspb.MakeDirRequest{Path: "/tmp/sec-made-dir"}),
		unaryRoute(sb, "Filesystem.Move", fs.Move, &fspb.MoveRequest{Source: "/tmp/sec-none", Destination: "/tmp/sec-none2"}),
		unaryRoute(sb, "Filesystem.ListDir", fs.ListDir, &fspb.ListDirRequest{Path: "/"}),
		unaryRoute(sb, "Filesystem.Remove", fs.Remove, &fspb.RemoveRequest{Path: "/tmp/sec-none"}),
		stream("Filesystem.WatchDir", func(ctx context.Context, h func(http.Header)) error {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			r := connect.NewRequest(&fspb.WatchDirRequest{Path: "/tmp"})
			h(r.Header())
			st, err := fs.WatchDir(ctx, r)
			if err != nil {
				return err
			}
			defer st.Close()
			if st.Receive() {
				return nil // the first event: the watch is on
			}
			return st.Err()
		}),
		unaryRoute(sb, "Filesystem.CreateWatcher", fs.CreateWatcher, &fspb.CreateWatcherRequest{Path: "/tmp"}),
		unaryRoute(sb, "Filesystem.GetWatcherEvents", fs.GetWatcherEvents, &fspb.GetWatcherEventsRequest{WatcherId: "sec-none"}),
		unaryRoute(sb, "Filesystem.RemoveWatcher", fs.RemoveWatcher, &fspb.RemoveWatcherRequest{WatcherId: "sec-none"}),
		unaryRoute(sb, "Process.List", pc.List, &pb.ListRequest{}),
		serverStreamRoute(sb, "Process.Start", pc.Start, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}}, 10*time.Second),
		serverStreamRoute(sb, "Process.Connect", pc.Connect, &pb.ConnectRequest{Process: nobody}, 5*time.Second),
		unaryRoute(sb, "Process.Update", pc.Update, &pb.UpdateRequest{Process: nobody}),
		stream("Process.StreamInput", func(ctx context.Context, h func(http.Header)) error {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			st := pc.StreamInput(ctx)
			h(st.RequestHeader())
			st.Send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: nobody}}})
			_, err := st.CloseAndReceive()
			return err
		}),
		unaryRoute(sb, "Process.SendInput", pc.SendInput, &pb.SendInputRequest{Process: nobody, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}),
		unaryRoute(sb, "Process.SendSignal", pc.SendSignal, &pb.SendSignalRequest{Process: nobody, Signal: pb.Signal_SIGNAL_SIGTERM}),
		unaryRoute(sb, "Process.CloseStdin", pc.CloseStdin, &pb.CloseStdinRequest{Process: nobody}),
		plain("GET", "/files?"+query("path", "/etc/hostname"), ""),
		plain("POST", "/files?"+query("path", "/tmp/sec-upload"), "x"),
		plain("POST", "/files/compose", `{"source_paths":["/tmp/sec-none"],"destination":"/tmp/sec-none2"}`),
		plain("GET", "/envs", ""),
		plain("GET", "/metrics", ""),
		plain("POST", "/init", `{}`),
	}
}

// Every envd route refuses a request without the sandbox's access token or
// with a wrong one; the right one passes (so the test can tell).
func TestEnvdRoutesWithoutOrWithWrongToken(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	if sb.EnvdToken == "" {
		t.Fatal("the sandbox has no envd access token")
	}
	ctx := context.Background()
	for _, rt := range envdRoutes(sb) {
		t.Run(rt.name, func(t *testing.T) {
			for _, tok := range []struct{ name, token string }{{"no token", ""}, {"a wrong token", "wrong-" + sb.EnvdToken}} {
				if err := rt.call(ctx, tok.token); !unauthorized(err) {
					t.Errorf("with %s: not refused as unauthenticated: %v", tok.name, err)
				}
			}
			if err := rt.call(ctx, sb.EnvdToken); unauthorized(err) {
				t.Errorf("control failed: the right token is refused too: %v", err)
			}
		})
	}
	// /health stays open: the platform polls it.
	if r := envdHTTP(t, sb, "GET", "/health", "", ""); r.Status != http.StatusNoContent {
		t.Errorf("GET /health without a token: %s, want 204", r)
	}
}

// An envd started without an access token (a build sandbox's, a restored
// snapshot's before /init) must refuse everything but /health. The test
// starts one inside a sandbox, on a loopback port of the sandbox's own,
// and calls it from there.
func TestEnvdWithoutConfiguredToken(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	r := sb.run(t, "root", `/opt/warren/envd --addr 127.0.0.1:49990 >/tmp/envd2.log 2>&1 &
for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:49990/health && break; sleep 0.1; done
for route in "GET /envs" "GET /metrics" "GET /files?path=/etc/hostname" "POST /process.Process/List" "POST /filesystem.Filesystem/ListDir"; do
  set -- $route
  if [ "$1" = GET ]; then code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:49990$2")
  else code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' --data-binary '{"path":"/"}' "http://127.0.0.1:49990$2"); fi
  echo "$route $code"
done
echo "health $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:49990/health)"`)
	t.Logf("%s", r.Stdout)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 6 || !strings.HasSuffix(lines[5], " 204") {
		t.Fatalf("the second envd did not come up: %s", r)
	}
	for _, l := range lines[:5] {
		if !strings.HasSuffix(l, " 401") {
			t.Errorf("envd with no token configured answered %q, want 401", l)
		}
	}
}

// A build step's sandbox has an envd with a fresh token: the step's own
// code cannot drive it without one.
func TestBuildSandboxEnvdNeedsToken(t *testing.T) {
	afterCase(t)
	b := linkTemplate(t, S.teamA, "sec-build-envd",
		`echo "envd-answered=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:49983/envs)"`)
	if b.Err != nil {
		t.Fatalf("the build failed: %v\n%s", b.Err, b.log())
	}
	defer removeLayers(t, ownLayers(t, b.BuildID))
	logs := b.stepLogs("1")
	if !strings.Contains(logs, "envd-answered=") {
		t.Fatalf("the step's output is not in the log:\n%s", logs)
	}
	if !strings.Contains(logs, "envd-answered=401") {
		t.Errorf("the build sandbox's envd answers without a token:\n%s", logs)
	}
}

// A subscriber of a process's output that never reads must not stall the
// others: the process's own stream still gets every byte and the end.
func TestSlowOutputSubscriber(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	const outputMB = 64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pc := processconnect.NewProcessClient(proxyClient, S.srv.proxyURL)
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh",
		Args: []string{"-c", fmt.Sprintf("sleep 2; yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c %dM", outputMB)}}})
	envdHeaders(req.Header(), sb.ID, sb.EnvdToken, "user")
	stream, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()

	// The slow subscriber: Process.Connect by hand on a connection whose
	// answer is never read.
	conn, err := net.Dial("tcp", strings.TrimPrefix(S.srv.proxyURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4096)
	msg := []byte(fmt.Sprintf(`{"process":{"pid":%d}}`, pid))
	env := append([]byte{0, byte(len(msg) >> 24), byte(len(msg) >> 16), byte(len(msg) >> 8), byte(len(msg))}, msg...)
	fmt.Fprintf(conn, "POST /process.Process/Connect HTTP/1.1\r\nHost: localhost\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: %d\r\n"+
		"X-Access-Token: %s\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n",
		sb.ID, envdinfo.Port, sb.EnvdToken, len(env))
	conn.Write(env)

	var got int64
	ended := false
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			got += int64(len(d.GetStdout()))
		}
		if ev.GetEnd() != nil {
			ended = true
			break
		}
	}
	if !ended || got != outputMB<<20 {
		t.Errorf("with a subscriber that does not read, the process's own stream got %d of %d MiB and ended=%v (%v): one slow subscriber stalls the others",
			got>>20, outputMB, ended, stream.Err())
	}
}

// A sandbox restored from a template's snapshot (its start command already
// running) has an envd that refuses everyone without the sandbox's own
// token, and takes that token.
func TestSnapshotRestoredSandboxNeedsToken(t *testing.T) {
	afterCase(t)
	rb, r := newRawBuild(t, S.teamA, "sec-snapshot", nil)
	if rb == nil {
		t.Fatalf("POST /v3/templates: %s", r)
	}
	r, err := S.srv.call(context.Background(), S.teamA, "POST", "/v2/templates/"+rb.TemplateID+"/builds/"+rb.BuildID,
		map[string]any{"fromTemplate": "base", "steps": []step{},
			"startCmd": "sleep 3600", "readyCmd": "true"})
	if err != nil || r.Status != http.StatusAccepted {
		t.Fatalf("starting the build: %v %v", err, r)
	}
	b := rb.wait(t)
	if b.Err != nil {
		t.Fatalf("the snapshot build failed: %v\n%s", b.Err, b.log())
	}
	defer removeLayers(t, ownLayers(t, b.BuildID))
	sb := mustCreate(t, S.teamA, createOpts{Template: rb.TemplateID})
	if got := sb.ok(t, "user", "pgrep -x sleep >/dev/null && echo restored"); got != "restored\n" {
		t.Fatalf("the sandbox was not restored with its start command running: %q", got)
	}
	for _, tok := range []string{"", "wrong-" + sb.EnvdToken} {
		if r := envdHTTP(t, sb, "GET", "/envs", tok, ""); r.Status != http.StatusUnauthorized {
			t.Errorf("the restored sandbox's envd with token %q: %s, want 401", tok, r)
		}
	}
	if r := envdHTTP(t, sb, "GET", "/envs", sb.EnvdToken, ""); r.Status != http.StatusOK {
		t.Errorf("the restored sandbox's envd refuses its own token: %s", r)
	}
}
