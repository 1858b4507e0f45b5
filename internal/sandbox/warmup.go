package sandbox

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/node"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// warmUp runs, in a new warm sandbox, what the SDK's first command runs:
// a login shell of the default user. Under gVisor the first exec of a
// binary and the first reads of the profile files go through the gofer
// and fill the sentry's caches; doing it here moves that cost (tens of
// milliseconds) from the user's first command to the pool's refill.
func warmUp(ctx context.Context, inst *node.Instance, token, user string, rt http.RoundTripper) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	client := processconnect.NewProcessClient(&http.Client{Transport: rt}, inst.EnvdURL())
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "true"}}})
	req.Header().Set("X-Access-Token", token)
	if user != "" {
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	stream, err := client.Start(ctx, req)
	if err != nil {
		return fmt.Errorf("sandbox: warming up %s: %w", inst.ID, err)
	}
	defer stream.Close()
	for stream.Receive() {
		if end := stream.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 {
				return fmt.Errorf("sandbox: warming up %s: the login shell exited with %d", inst.ID, end.GetExitCode())
			}
			return nil
		}
	}
	return fmt.Errorf("sandbox: warming up %s: %v", inst.ID, stream.Err())
}
