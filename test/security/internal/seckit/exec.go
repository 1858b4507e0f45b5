package seckit

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// EnvdPort is envd's port in every sandbox.
const EnvdPort = 49983

// Result is a finished command: its stdout (the first MiB) and exit code
// (-1 when it did not finish).
type Result struct {
	Stdout string
	Exit   int
}

// Exec runs a shell script in sandbox id through the sandbox proxy at
// proxyURL (routed by headers, as the SDK does when it has no domain),
// with the sandbox's envd token, within a minute.
func Exec(ctx context.Context, proxyURL, id, envdToken, script string) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cl := processconnect.NewProcessClient(http.DefaultClient, proxyURL)
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}})
	req.Header().Set("E2b-Sandbox-Id", id)
	req.Header().Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
	req.Header().Set("X-Access-Token", envdToken)
	req.Header().Set("Authorization", "Basic dXNlcjo=") // user:
	stream, err := cl.Start(ctx, req)
	if err != nil {
		return Result{Exit: -1}, err
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil && out.Len() < 1<<20 {
			out.Write(d.GetStdout())
		}
		if end := ev.GetEnd(); end != nil {
			return Result{Stdout: out.String(), Exit: int(end.GetExitCode())}, nil
		}
	}
	if err := stream.Err(); err != nil {
		return Result{Exit: -1}, err
	}
	return Result{Exit: -1}, errors.New("the stream ended before the process")
}
