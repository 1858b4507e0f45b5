package template

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/node"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// sandboxShell runs "$1" with bash as a login shell when the image has
// bash (what the SDK's commands get, and what RUN steps are written for),
// else with sh (minimal images). Arguments after the command are $1… of it.
const sandboxShell = `cmd="$1"; shift; if [ -x /bin/bash ]; then exec /bin/bash -l -c "$cmd" sh "$@"; else exec /bin/sh -c "$cmd" sh "$@"; fi`

// execSpec is one command in a build sandbox.
type execSpec struct {
	User string // "" = root
	Cwd  string // "" = the user's home
	Envs map[string]string
	// Script is a shell command; Args are its $1….
	Script string
	Args   []string
	// Output gets stdout and stderr as they come.
	Output func(stderr bool, data []byte)
}

// envdClient talks to the envd of one build sandbox.
type envdClient struct {
	inst    *node.Instance
	token   string
	http    *http.Client
	process processconnect.ProcessClient
}

// newToken is a fresh envd access token: every build sandbox gets its
// own, so that nothing but its build can reach its envd.
func newToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func newEnvdClient(inst *node.Instance, token string) *envdClient {
	// No connection outlives the sandbox: one transport per sandbox,
	// closed with it.
	h := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	return &envdClient{inst: inst, token: token, http: h, process: processconnect.NewProcessClient(h, inst.EnvdURL())}
}

func (c *envdClient) close() { c.http.CloseIdleConnections() }

func (c *envdClient) auth(h http.Header, user string) {
	if c.token != "" {
		h.Set("X-Access-Token", c.token)
	}
	if user == "" {
		user = "root"
	}
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
}

// start launches a process and returns its event stream.
func (c *envdClient) start(ctx context.Context, e execSpec) (*connect.ServerStreamForClient[pb.StartResponse], error) {
	cfg := &pb.ProcessConfig{Cmd: "/bin/sh", Args: append([]string{"-c", sandboxShell, "sh", e.Script}, e.Args...), Envs: e.Envs}
	if e.Cwd != "" {
		cfg.Cwd = &e.Cwd
	}
	req := connect.NewRequest(&pb.StartRequest{Process: cfg})
	c.auth(req.Header(), e.User)
	return c.process.Start(ctx, req)
}

// run runs a command to its end and returns its exit code.
func (c *envdClient) run(ctx context.Context, e execSpec) (int, error) {
	stream, err := c.start(ctx, e)
	if err != nil {
		return -1, err
	}
	defer stream.Close()
	return wait(stream, e.Output)
}

// wait reads a process's events until it ends.
func wait(stream *connect.ServerStreamForClient[pb.StartResponse], output func(bool, []byte)) (int, error) {
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil && output != nil {
			if b := d.GetStdout(); len(b) > 0 {
				output(false, b)
			}
			if b := d.GetStderr(); len(b) > 0 {
				output(true, b)
			}
		}
		if end := ev.GetEnd(); end != nil {
			if end.Error != nil && *end.Error != "" && !end.GetExited() {
				return -1, errors.New(*end.Error)
			}
			return int(end.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, err
	}
	return -1, errors.New("the process's stream ended before the process")
}

// upload writes body to path in the sandbox, as root.
func (c *envdClient) upload(ctx context.Context, body io.Reader, path string) error {
	q := url.Values{"path": {path}, "username": {"root"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.inst.EnvdURL()+"/files?"+q.Encode(), body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	c.auth(req.Header, "root")
	res, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
		return fmt.Errorf("uploading to the build sandbox: %s: %s", res.Status, bytes.TrimSpace(b))
	}
	return nil
}
