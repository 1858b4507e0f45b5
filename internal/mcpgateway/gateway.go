// Package mcpgateway is Warren's MCP gateway, the program behind the E2B
// SDK's `Sandbox.create({ mcp: {...} })`: inside a sandbox of the
// `mcp-gateway` template, the SDK runs `mcp-gateway --config '<json>'` as
// root with GATEWAY_ACCESS_TOKEN, and then hands its user the URL
// https://<host of port 50005>/mcp and the token.
//
// The gateway starts each server the config names as a stdio child
// process (ParseConfig says which configs are accepted), connects to it
// as an MCP client, and serves the tools of all of them as one MCP server
// over the streamable HTTP transport, each tool's name prefixed with its
// server's (Server.ExposedName), behind the bearer token. Both sides are
// the official Go MCP SDK.
//
// The servers run as the sandbox's user (uid 1000, `user`), as the SDK's
// commands do, not as root like the gateway: a config is tenant input,
// and nothing it names needs more. Resources and prompts of the servers
// are not served, only their tools, listed once at start.
package mcpgateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Port is where the SDK expects the gateway (Sandbox.mcpPort).
const Port = 50005

// TokenPath is where Sandbox.getMcpToken reads the token (as root).
const TokenPath = "/etc/mcp-gateway/.token"

// Version is the gateway's version in its MCP handshake.
const Version = "1.0.0"

// Options configures Start.
type Options struct {
	Servers []Server
	// Token is the bearer token every request must carry.
	Token string
	// Credential, if set, is who the servers run as; nil: as the gateway.
	Credential *syscall.Credential
	// Home is the servers' HOME; their repositories are checked out
	// under Home/mcp-servers/<owner>/<repo>.
	Home string
	// BaseEnv is the environment every server starts with (PATH, HOME,
	// USER...); a server's envs are added to it.
	BaseEnv []string
	// Clone makes the checkout of a server's repository in dir; nil:
	// `git clone --depth 1` from GitHub. A directory that exists already
	// (pre-pulled into a template) is used as it is.
	Clone func(ctx context.Context, s Server, dir string) error
	// Logs receives the servers' stderr and the install commands' output;
	// nil: discarded.
	Logs   io.Writer
	Logger *slog.Logger
}

// Gateway is a running gateway: its servers' sessions and the MCP server
// that serves their tools.
type Gateway struct {
	opts     Options
	server   *mcp.Server
	mu       sync.Mutex
	sessions []*mcp.ClientSession
	handler  http.Handler
}

// Start starts every server, lists its tools and registers them. On an
// error, every server already started is stopped again.
func Start(ctx context.Context, opts Options) (*Gateway, error) {
	if opts.Token == "" {
		return nil, errors.New("mcpgateway: an empty token would let anyone in")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Logs == nil {
		opts.Logs = io.Discard
	}
	g := &Gateway{opts: opts}
	g.server = mcp.NewServer(&mcp.Implementation{Name: "warren-mcp-gateway", Version: Version}, &mcp.ServerOptions{Logger: opts.Logger})
	for _, s := range opts.Servers {
		if err := g.startServer(ctx, s); err != nil {
			g.Close()
			return nil, fmt.Errorf("server %q: %w", s.Key, err)
		}
	}
	streamable := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, &mcp.StreamableHTTPOptions{
		Logger:         opts.Logger,
		SessionTimeout: 30 * time.Minute,
	})
	mux := http.NewServeMux()
	mux.Handle("/mcp", streamable)
	g.handler = g.requireToken(mux)
	return g, nil
}

// Handler serves /mcp to requests with the bearer token.
func (g *Gateway) Handler() http.Handler { return g.handler }

// requireToken refuses, with 401, every request without
// "Authorization: Bearer <token>"; the comparison takes the same time
// wherever the first difference is.
func (g *Gateway) requireToken(next http.Handler) http.Handler {
	want := []byte(g.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcp-gateway"`)
			http.Error(w, "unauthorized: this MCP gateway needs Authorization: Bearer <the sandbox's MCP token>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Close stops every server (closing its stdin, then SIGTERM, then the
// SDK's kill) and their process groups.
func (g *Gateway) Close() error {
	g.mu.Lock()
	sessions := g.sessions
	g.sessions = nil
	g.mu.Unlock()
	var errs []error
	for _, cs := range sessions {
		if err := cs.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// repoDir is where a server's repository is checked out.
func (g *Gateway) repoDir(s Server) string {
	return filepath.Join(g.opts.Home, "mcp-servers", s.Owner, s.Repo)
}

func (g *Gateway) startServer(ctx context.Context, s Server) error {
	dir := g.repoDir(s)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := g.checkout(ctx, s, dir); err != nil {
			return err
		}
		if s.InstallCmd != "" {
			cmd := g.command(ctx, s, dir, s.InstallCmd)
			cmd.Stdout, cmd.Stderr = g.opts.Logs, g.opts.Logs
			fmt.Fprintf(g.opts.Logs, "[%s] installCmd: %s\n", s.Key, s.InstallCmd)
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("installCmd failed (%v); its output is in the gateway's log", err)
			}
		}
	} else if err != nil {
		return err
	}

	cmd := g.command(context.WithoutCancel(ctx), s, dir, s.RunCmd)
	cmd.Stderr = g.opts.Logs
	client := mcp.NewClient(&mcp.Implementation{Name: "warren-mcp-gateway", Version: Version}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil)
	if err != nil {
		if cmd.Process != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		return fmt.Errorf("runCmd did not start an MCP server on stdio: %v", err)
	}
	g.mu.Lock()
	g.sessions = append(g.sessions, cs)
	g.mu.Unlock()
	n := 0
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("listing its tools: %v", err)
		}
		if n++; n > MaxToolsPerServer {
			return fmt.Errorf("it lists more than %d tools", MaxToolsPerServer)
		}
		if err := g.addTool(s, cs, tool); err != nil {
			return err
		}
	}
	return nil
}

// addTool registers tool of server s under its prefixed name, forwarding
// calls to cs.
func (g *Gateway) addTool(s Server, cs *mcp.ClientSession, tool *mcp.Tool) error {
	name := s.ExposedName(tool.Name)
	if !validToolName(name) {
		return fmt.Errorf("tool %q: %q is not a usable tool name (at most 128 of A-Z a-z 0-9 _ - .)", clip(tool.Name), clip(name))
	}
	schema, ok := tool.InputSchema.(map[string]any)
	if !ok || schema["type"] != "object" {
		return fmt.Errorf("tool %q: its inputSchema is not a JSON schema of type object", tool.Name)
	}
	exposed := *tool
	exposed.Name = name
	if out, ok := tool.OutputSchema.(map[string]any); tool.OutputSchema != nil && (!ok || out["type"] != "object") {
		exposed.OutputSchema = nil // not one MCP allows; the results pass as they are
	}
	original := tool.Name
	return addTool(g.server, &exposed, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: original, Arguments: req.Params.Arguments, Meta: req.Params.Meta})
	})
}

// addTool is Server.AddTool, which panics on a tool it cannot serve: a
// server's tool list is its own input, and must not end the gateway.
func addTool(s *mcp.Server, t *mcp.Tool, h mcp.ToolHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("tool %q cannot be served: %v", t.Name, r)
		}
	}()
	s.AddTool(t, h)
	return nil
}

func validToolName(name string) bool {
	if name == "" || len(name) > 128 {
		return false
	}
	for _, r := range name {
		if !(r == '_' || r == '-' || r == '.' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return false
		}
	}
	return true
}

// command is a shell command of server s in dir, as the servers' user, in
// a process group of its own so that Close reaches its children too.
func (g *Gateway) command(ctx context.Context, s Server, dir, script string) *exec.Cmd {
	shell := []string{"/bin/sh", "-c", script}
	if _, err := os.Stat("/bin/bash"); err == nil {
		shell = []string{"/bin/bash", "-l", "-c", script}
	}
	cmd := exec.CommandContext(ctx, shell[0], shell[1:]...)
	cmd.Dir = dir
	cmd.Env = append([]string(nil), g.opts.BaseEnv...)
	for k, v := range s.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: g.opts.Credential}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

// checkout makes dir hold the server's repository, owned by the
// servers' user.
func (g *Gateway) checkout(ctx context.Context, s Server, dir string) error {
	if err := g.mkdirOwned(filepath.Dir(dir)); err != nil {
		return err
	}
	clone := g.opts.Clone
	if clone == nil {
		clone = g.gitClone
	}
	if err := clone(ctx, s, dir); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("cloning github.com/%s/%s: %v", s.Owner, s.Repo, err)
	}
	return nil
}

func (g *Gateway) gitClone(ctx context.Context, s Server, dir string) error {
	url := "https://github.com/" + s.Owner + "/" + s.Repo + ".git"
	cmd := exec.CommandContext(ctx, "git", "clone", "--depth", "1", "--", url, dir)
	cmd.Env = append(append([]string(nil), g.opts.BaseEnv...), "GIT_TERMINAL_PROMPT=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: g.opts.Credential}
	cmd.Stdout, cmd.Stderr = g.opts.Logs, g.opts.Logs
	return cmd.Run()
}

// mkdirOwned makes dir and its missing parents under Home, owned by the
// servers' user.
func (g *Gateway) mkdirOwned(dir string) error {
	rel, err := filepath.Rel(g.opts.Home, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("%s is outside %s", dir, g.opts.Home)
	}
	p := g.opts.Home
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		p = filepath.Join(p, part)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if c := g.opts.Credential; c != nil {
			if err := os.Lchown(p, int(c.Uid), int(c.Gid)); err != nil {
				return err
			}
		}
	}
	return nil
}
