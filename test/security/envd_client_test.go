package security

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/store"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// proxyClient carries envd calls to the proxy; a stream may run for as
// long as its context allows.
var proxyClient = &http.Client{}

// envdHeaders sets what the SDK sends on envd calls through
// E2B_SANDBOX_URL: the sandbox and port, the access token (if not empty)
// and the user.
func envdHeaders(h http.Header, sandboxID, token, user string) {
	h.Set("E2b-Sandbox-Id", sandboxID)
	h.Set("E2b-Sandbox-Port", strconv.Itoa(envdinfo.Port))
	if token != "" {
		h.Set("X-Access-Token", token)
	}
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// result is a finished command.
type result struct {
	Stdout, Stderr string
	Exit           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.Exit, tail(r.Stdout, 600), tail(r.Stderr, 600))
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// exec runs script with /bin/sh as user in sb through the proxy and envd,
// and waits for it (at most timeout).
func (sb *sandbox) exec(ctx context.Context, user, script string, timeout time.Duration) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := processconnect.NewProcessClient(proxyClient, sb.srv.proxyURL)
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}})
	envdHeaders(req.Header(), sb.ID, sb.EnvdToken, user)
	stream, err := c.Start(ctx, req)
	if err != nil {
		return result{Exit: -1}, err
	}
	defer stream.Close()
	var out, errOut strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			if out.Len() < 1<<20 {
				out.Write(d.GetStdout())
			}
			if errOut.Len() < 1<<20 {
				errOut.Write(d.GetStderr())
			}
		}
		if end := ev.GetEnd(); end != nil {
			r := result{Stdout: out.String(), Stderr: errOut.String(), Exit: int(end.GetExitCode())}
			if !end.GetExited() {
				r.Exit = -1
				if r.Stderr == "" {
					r.Stderr = end.GetError()
				}
			}
			return r, nil
		}
	}
	r := result{Stdout: out.String(), Stderr: errOut.String(), Exit: -1}
	if err := stream.Err(); err != nil {
		return r, err
	}
	return r, errors.New("the process's stream ended before the process")
}

// run runs script as user and fails the test if it cannot be run (its
// exit code is the caller's to judge).
func (sb *sandbox) run(t *testing.T, user, script string) result {
	t.Helper()
	r, err := sb.exec(context.Background(), user, script, 2*time.Minute)
	if err != nil {
		t.Fatalf("running %q in %s: %v (%s)", script, sb.ID, err, r)
	}
	return r
}

// ok runs script as user and fails the test unless it exits 0.
func (sb *sandbox) ok(t *testing.T, user, script string) string {
	t.Helper()
	r := sb.run(t, user, script)
	if r.Exit != 0 {
		t.Fatalf("%q in %s: %s", script, sb.ID, r)
	}
	return r.Stdout
}

// nodeHealthy checks what every case must leave intact: the API answers,
// the witness sandbox runs a command, the host canaries are unchanged.
func nodeHealthy(t *testing.T) {
	t.Helper()
	res, err := http.Get(S.srv.apiURL + "/health")
	if err != nil {
		t.Errorf("node: the API does not answer: %v", err)
	} else {
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("node: GET /health answered %d", res.StatusCode)
		}
	}
	r, err := S.witness.exec(context.Background(), "user", "echo witness-ok", 30*time.Second)
	if err != nil || r.Exit != 0 || strings.TrimSpace(r.Stdout) != "witness-ok" {
		t.Errorf("node: the witness sandbox %s does not answer: %v %s", S.witness.ID, err, r)
	}
	for _, bad := range S.canaries.check() {
		t.Errorf("node: %s", bad)
	}
	for _, stray := range S.strays() {
		t.Errorf("node: %s", stray)
	}
}

// strays lists root filesystems and cgroups of no live sandbox: what a
// failed create or build left. Builds must have ended.
func (s *suite) strays() []string {
	var out []string
	poll.Within(10*time.Second, 250*time.Millisecond, func() bool {
		out = out[:0]
		live := s.liveSandboxes()
		if live == nil {
			out = append(out, "cannot read the live sandboxes from the store")
			return true
		}
		ents, _ := os.ReadDir(filepath.Join(s.srv.dataDir, "sandboxes"))
		for _, e := range ents {
			if !live[e.Name()] {
				out = append(out, "stray root filesystem sandboxes/"+e.Name())
			}
		}
		for _, cg := range cgroupsBelow(s.srv.cgroupParent) {
			if !live[cg] {
				out = append(out, "stray cgroup "+filepath.Join(s.srv.cgroupParent, cg))
			}
		}
		return len(out) == 0
	})
	return out
}

// liveSandboxes are the IDs of sandboxes the store has running, paused or
// being created, of every team of the suite.
func (s *suite) liveSandboxes() map[string]bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.srv.openStore(ctx)
	if err != nil {
		return nil
	}
	defer st.Close()
	live := map[string]bool{}
	for _, tm := range []team{s.teamA, s.teamB, s.teamC} {
		l, err := st.ListSandboxes(ctx, store.SandboxFilter{Teams: store.ForTeam(tm.id),
			States: []store.SandboxState{store.StateRunning, store.StatePaused, store.StateCreating}})
		if err != nil {
			return nil
		}
		for _, x := range l {
			live[x.ID] = true
		}
	}
	return live
}

// afterCase registers nodeHealthy to run when the test ends, after its
// sandboxes are killed (cleanups run last-registered first, so call it
// before creating them).
func afterCase(t *testing.T) {
	t.Cleanup(func() { nodeHealthy(t) })
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
