package process

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/poll"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// lowerMaxLag makes subscribers fall behind after n bytes for one test.
func lowerMaxLag(t *testing.T, n int) {
	old := maxLag
	maxLag = n
	t.Cleanup(func() { maxLag = old })
}

// stallingOutput is more output than a subscriber may lag behind (in
// these tests) plus what loopback socket buffers absorb for a client that
// stops reading. It is random: Connect compresses messages, and zeros
// would shrink to a size that any buffer holds.
const stallingOutput = 24 << 20

// fastOutput writes stallingOutput bytes as fast as it can; pacedOutput
// writes them in 1 MiB pieces about 10 times a second, which a client
// that reads keeps up with even on a busy machine.
var (
	fastOutput  = "head -c " + strconv.Itoa(stallingOutput) + " /dev/urandom"
	pacedOutput = "for i in $(seq " + strconv.Itoa(stallingOutput>>20) + "); do head -c 1048576 /dev/urandom; sleep 0.1; done"
)

// smallWindowClient is a client whose connections have a small fixed
// receive buffer: loopback TCP autotunes up to tcp_rmem's maximum (32 MiB
// here), which would hide a client that stops reading behind the kernel's
// buffers. What the server's send buffer holds (wmem_max, 4 MiB here)
// stays well below stallingOutput.
func smallWindowClient(url string) processconnect.ProcessClient {
	dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10)
		})
		return errors.Join(err, serr)
	}}
	hc := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
	return processconnect.NewProcessClient(hc, url, plain)
}

// plain makes a client use the binary codec without compression: these
// tests are about the fan-out, and the cheaper the client's decoding the
// less a busy machine (or the race detector) can make a reading client
// fall behind.
var plain = connect.WithClientOptions(connect.WithAcceptCompression("gzip", nil, nil))

// startWaiting starts a process that waits for a line on stdin, then
// runs script, and returns its Start stream after the start event.
func startWaiting(t *testing.T, ctx context.Context, c processconnect.ProcessClient, script string) (*connect.ServerStreamForClient[pb.StartResponse], uint32) {
	t.Helper()
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "read go; " + script}}})
	live, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !live.Receive() {
		t.Fatalf("no start event: %v", live.Err())
	}
	return live, live.Msg().GetEvent().GetStart().GetPid()
}

func sendLine(t *testing.T, ctx context.Context, c processconnect.ProcessClient, pid uint32) {
	t.Helper()
	_, err := c.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		Input:   &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("go\n")}},
	}))
	if err != nil {
		t.Fatal(err)
	}
}

// One subscriber that stops reading must not hold back the others or the
// process: the live one gets every byte and the end, the process exits,
// and the stalled one's stream ends with an error once it reads again.
func TestStalledSubscriberDoesNotStallOthers(t *testing.T) {
	lowerMaxLag(t, 8<<20)
	_, srv := newTestServer(t, "")
	c := processconnect.NewProcessClient(srv.Client(), srv.URL, plain)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	live, pid := startWaiting(t, ctx, c, pacedOutput)

	stalled, err := smallWindowClient(srv.URL).Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	if err != nil {
		t.Fatal(err)
	}
	if !stalled.Receive() { // its start event: it is subscribed now
		t.Fatalf("connect: %v", stalled.Err())
	}
	sendLine(t, ctx, c, pid)

	r := collectFrom(live, func() *pb.ProcessEvent { return live.Msg().GetEvent() }, false)
	if r.err != nil || r.end == nil || r.end.GetExitCode() != 0 || len(r.stdout) != stallingOutput {
		t.Fatalf("live subscriber: err %v, end %v, %d of %d bytes", r.err, r.end, len(r.stdout), stallingOutput)
	}

	s := collectFrom(stalled, func() *pb.ProcessEvent { return stalled.Msg().GetEvent() }, false)
	if s.end != nil || connect.CodeOf(s.err) != connect.CodeResourceExhausted {
		t.Errorf("stalled subscriber: end %v, err %v; want its stream ended with resource_exhausted", s.end, s.err)
	}
	if len(s.stdout) >= stallingOutput {
		t.Errorf("stalled subscriber got all %d bytes: it never fell behind, the test proves nothing", len(s.stdout))
	}
}

// A process whose only client stops reading still runs to its end: its
// pipes are drained whatever the client does.
func TestProcessDoesNotWaitForItsClient(t *testing.T) {
	lowerMaxLag(t, 1<<20)
	_, srv := newTestServer(t, "")
	c := processconnect.NewProcessClient(srv.Client(), srv.URL, plain)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stalled, pid := startWaiting(t, ctx, smallWindowClient(srv.URL), fastOutput)
	defer stalled.Close()
	sendLine(t, ctx, c, pid)
	ended := poll.Within(10*time.Second, 50*time.Millisecond, func() bool {
		res, err := c.List(ctx, connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Msg.GetProcesses() {
			if p.GetPid() == pid {
				return false
			}
		}
		return true
	})
	if !ended {
		t.Fatal("the process is still running: it blocks on its stalled client")
	}
}
