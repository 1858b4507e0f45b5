package process

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/envd/reaper"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/internal/poll"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

var (
	reaperOnce sync.Once
	testReaper *reaper.Reaper
)

// newTestService serves a process service over loopback and returns a
// client that speaks the JSON codec, as the E2B SDK does.
func newTestService(t testing.TB, defaultUser string) (*Service, processconnect.ProcessClient) {
	t.Helper()
	svc, srv := newTestServer(t, defaultUser)
	return svc, processconnect.NewProcessClient(srv.Client(), srv.URL, connect.WithProtoJSON())
}

// newTestServer serves a process service over loopback.
func newTestServer(t testing.TB, defaultUser string) (*Service, *httptest.Server) {
	t.Helper()
	reaperOnce.Do(func() {
		r, err := reaper.Start()
		if err != nil {
			t.Fatalf("starting reaper: %v", err)
		}
		testReaper = r
	})
	svc := NewService(settings.New(defaultUser, "", ""), testReaper)
	path, h := processconnect.NewProcessHandler(svc)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return svc, srv
}

func basicAuth(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

func shell(cmd string) *pb.StartRequest {
	no := false
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}}, Stdin: &no}
}

type result struct {
	pid            uint32
	stdout, stderr []byte
	pty            []byte
	end            *pb.ProcessEvent_EndEvent
	keepalives     int
	err            error
}

type eventStream interface {
	Receive() bool
	Err() error
}

// collect reads a Start or Connect stream to its end, starting with its
// start event.
func collect(stream eventStream, event func() *pb.ProcessEvent) result {
	return collectFrom(stream, event, true)
}

// collectFrom reads a stream to its end; first says whether the start
// event is still to come.
func collectFrom(stream eventStream, event func() *pb.ProcessEvent, first bool) result {
	var r result
	for stream.Receive() {
		ev := event()
		if first {
			first = false
			st, ok := ev.Event.(*pb.ProcessEvent_Start)
			if !ok {
				r.err = errors.New("first event is not start")
				return r
			}
			r.pid = st.Start.Pid
			continue
		}
		switch e := ev.Event.(type) {
		case *pb.ProcessEvent_Data:
			r.stdout = append(r.stdout, e.Data.GetStdout()...)
			r.stderr = append(r.stderr, e.Data.GetStderr()...)
			r.pty = append(r.pty, e.Data.GetPty()...)
		case *pb.ProcessEvent_End:
			r.end = e.End
		case *pb.ProcessEvent_Keepalive:
			r.keepalives++
		}
	}
	if r.err == nil {
		r.err = stream.Err()
	}
	return r
}

func run(t *testing.T, c processconnect.ProcessClient, req *connect.Request[pb.StartRequest]) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.Start(ctx, req)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer stream.Close()
	return collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
}

func TestStartStreamsOutputAndExit(t *testing.T) {
	_, c := newTestService(t, "root")
	r := run(t, c, connect.NewRequest(shell("echo out; echo err >&2; exit 3")))
	if r.err != nil {
		t.Fatalf("stream error: %v", r.err)
	}
	if r.pid == 0 {
		t.Error("start event carried pid 0")
	}
	if string(r.stdout) != "out\n" || string(r.stderr) != "err\n" {
		t.Errorf("stdout %q stderr %q", r.stdout, r.stderr)
	}
	if r.end == nil || r.end.ExitCode != 3 || !r.end.Exited || r.end.Status != "exit status 3" || r.end.GetError() != "exit status 3" {
		t.Errorf("end event = %v", r.end)
	}
}

func TestStartAsUserAndCwd(t *testing.T) {
	_, c := newTestService(t, "nobody")
	r := run(t, c, connect.NewRequest(shell("id -un; pwd")))
	if got := strings.Fields(string(r.stdout)); len(got) != 2 || got[0] != "nobody" {
		t.Errorf("default user: stdout %q err %v", r.stdout, r.err)
	}
	req := connect.NewRequest(shell("id -un; pwd; echo $FOO"))
	cwd := "/tmp"
	req.Msg.Process.Cwd = &cwd
	req.Msg.Process.Envs = map[string]string{"FOO": "bar"}
	req.Header().Set("Authorization", basicAuth("root"))
	r = run(t, c, req)
	if string(r.stdout) != "root\n/tmp\nbar\n" {
		t.Errorf("as root in /tmp: stdout %q err %v", r.stdout, r.err)
	}
}

func TestStartErrors(t *testing.T) {
	_, c := newTestService(t, "root")
	req := connect.NewRequest(shell("true"))
	req.Header().Set("Authorization", basicAuth("no-such-user-xyz"))
	if r := run(t, c, req); connect.CodeOf(r.err) != connect.CodeUnauthenticated {
		t.Errorf("unknown user: err %v, want unauthenticated", r.err)
	}
	req = connect.NewRequest(shell("true"))
	bad := "/does/not/exist"
	req.Msg.Process.Cwd = &bad
	if r := run(t, c, req); connect.CodeOf(r.err) != connect.CodeInvalidArgument {
		t.Errorf("bad cwd: err %v, want invalid_argument", r.err)
	}
	req = connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/no/such/binary"}})
	if r := run(t, c, req); connect.CodeOf(r.err) != connect.CodeInvalidArgument {
		t.Errorf("bad binary: err %v, want invalid_argument", r.err)
	}
}

func TestStdinInputAndClose(t *testing.T) {
	_, c := newTestService(t, "root")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	yes := true
	stream, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: &yes}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatalf("no start event: %v", stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := c.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}}})); err != nil {
		t.Fatalf("SendInput: %v", err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	r := collectFrom(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }, false)
	if string(r.stdout) != "hello\n" || r.end == nil || r.end.ExitCode != 0 {
		t.Errorf("stdout %q end %v err %v", r.stdout, r.end, r.err)
	}
}

func TestTimeoutKillsProcess(t *testing.T) {
	_, c := newTestService(t, "root")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	stream, err := c.Start(ctx, connect.NewRequest(shell("sleep 30")))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
	if connect.CodeOf(r.err) != connect.CodeDeadlineExceeded {
		t.Errorf("err %v, want deadline_exceeded", r.err)
	}
	waitGone(t, int(r.pid))
}

func TestDisconnectLeavesProcessRunningAndConnectAttaches(t *testing.T) {
	svc, c := newTestService(t, "root")
	ctx, cancel := context.WithCancel(context.Background())
	tag := "worker"
	req := shell("sleep 0.5; echo later")
	req.Tag = &tag
	stream, err := c.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatalf("no start: %v", stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	cancel()
	stream.Close()

	list, err := c.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var found *pb.ProcessInfo
	for _, p := range list.Msg.Processes {
		if p.Pid == pid {
			found = p
		}
	}
	if found == nil || found.GetTag() != tag || found.GetConfig().GetCmd() != "/bin/bash" {
		t.Fatalf("List after disconnect: %v", list.Msg.Processes)
	}

	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	cs, err := c.Connect(cctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(cs, func() *pb.ProcessEvent { return cs.Msg().GetEvent() })
	if r.pid != pid || string(r.stdout) != "later\n" || r.end == nil || r.end.ExitCode != 0 {
		t.Errorf("Connect: pid %d stdout %q end %v err %v", r.pid, r.stdout, r.end, r.err)
	}
	// Once exited, a Connect replays start and end.
	cs2, err := c.Connect(cctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(cs2, func() *pb.ProcessEvent { return cs2.Msg().GetEvent() }); r.pid != pid || r.end == nil {
		t.Errorf("replay after exit: %+v", r)
	}
	svc.mu.Lock()
	_, still := svc.running[pid]
	svc.mu.Unlock()
	if still {
		t.Error("exited process still listed as running")
	}
}

func TestSignalsAndUnknownPid(t *testing.T) {
	_, c := newTestService(t, "root")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.Start(ctx, connect.NewRequest(shell("sleep 30 & sleep 30; wait")))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	t.Logf("pid %d", pid)
	out, _ := exec.Command("ps", "-o", "pid,pgid,stat,cmd", "-g", strconv.Itoa(int(pid))).CombinedOutput()
	t.Logf("%s", out)
	if _, err := c.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatalf("SendSignal: %v", err)
	}
	r := collectFrom(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }, false)
	if r.end == nil || r.end.ExitCode != -1 || r.end.Exited || r.end.Status != "signal: killed" {
		t.Errorf("end after kill: %v (err %v)", r.end, r.err)
	}
	if r.err != nil {
		t.Errorf("stream err %v", r.err)
	}
	unknown := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}
	_, err = c.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: unknown, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown pid: %v, want not_found", err)
	}
	_, err = c.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: unknown, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("SendInput unknown pid: %v, want not_found", err)
	}
}

func TestPTYInputAndResize(t *testing.T) {
	_, c := newTestService(t, "root")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"--norc", "-i"}, Envs: map[string]string{"PS1": "$ "}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := c.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 40}}})); err != nil {
		t.Fatalf("Update: %v", err)
	}
	_, err = c.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("CloseStdin on a PTY: %v, want failed_precondition", err)
	}
	if _, err := c.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("stty size; exit 7\n")}}})); err != nil {
		t.Fatalf("SendInput: %v", err)
	}
	r := collectFrom(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }, false)
	if !bytes.Contains(r.pty, []byte("40 100")) {
		t.Errorf("pty output %q lacks the new size", r.pty)
	}
	if r.end == nil || r.end.ExitCode != 7 {
		t.Errorf("end %v err %v", r.end, r.err)
	}
}

func TestLargeOutputIntact(t *testing.T) {
	_, c := newTestService(t, "root")
	const size = 5 << 20
	r := run(t, c, connect.NewRequest(shell("head -c "+strconv.Itoa(size)+" /dev/zero | tr '\\0' 'a'")))
	if len(r.stdout) != size {
		t.Fatalf("got %d bytes, want %d (err %v)", len(r.stdout), size, r.err)
	}
	if sha256.Sum256(r.stdout) != sha256.Sum256(bytes.Repeat([]byte("a"), size)) {
		t.Error("output corrupted")
	}
}

func TestKeepalive(t *testing.T) {
	_, c := newTestService(t, "root")
	req := connect.NewRequest(shell("sleep 1.6"))
	req.Header().Set("Keepalive-Ping-Interval", "1")
	if r := run(t, c, req); r.keepalives < 1 || r.end == nil {
		t.Errorf("keepalives %d end %v err %v", r.keepalives, r.end, r.err)
	}
}

func TestOrphansAreReaped(t *testing.T) {
	_, c := newTestService(t, "root")
	// The grandchild outlives its parent, is re-parented to us (the
	// subreaper) and must not stay a zombie.
	r := run(t, c, connect.NewRequest(shell("(sleep 0.2; exit 0) > /dev/null 2>&1 & echo $!")))
	orphan, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
	if err != nil {
		t.Fatalf("orphan pid %q: %v", r.stdout, err)
	}
	waitGone(t, orphan)
}

// waitGone waits until pid no longer exists (not even as a zombie).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	if poll.Within(5*time.Second, 20*time.Millisecond, func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		return errors.Is(err, os.ErrNotExist)
	}) {
		return
	}
	state, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	t.Errorf("pid %d still exists: %s", pid, state)
}

func TestEndEventWording(t *testing.T) {
	ws := syscall.WaitStatus(uint32(syscall.SIGKILL))
	end := endEvent(ws).GetEnd()
	if end.ExitCode != -1 || end.Exited || end.Status != "signal: killed" || end.GetError() != "signal: killed" {
		t.Errorf("killed: %v", end)
	}
	if end := endEvent(syscall.WaitStatus(0)).GetEnd(); end.ExitCode != 0 || !end.Exited || end.Error != nil || end.Status != "exit status 0" {
		t.Errorf("clean exit: %v", end)
	}
}

// BenchmarkStartTrue is envd's own share of a command round trip: Start of
// /bin/true through the JSON codec until its end event, without the login
// shell (bash -l) that the SDK wraps every command in.
func BenchmarkStartTrue(b *testing.B) {
	_, c := newTestService(b, "root")
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stream, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}}))
		if err != nil {
			b.Fatal(err)
		}
		for stream.Receive() {
		}
		stream.Close()
		cancel()
	}
}
