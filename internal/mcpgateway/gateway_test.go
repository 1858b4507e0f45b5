package mcpgateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The test binary doubles as a tiny stdio MCP server (runTestServer) when
// started with testServerEnv set: the gateway's tests start it by runCmd.
const testServerEnv = "MCPGW_TEST_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(testServerEnv) != "" {
		runTestServer()
		return
	}
	os.Exit(m.Run())
}

type echoArgs struct {
	Text string `json:"text"`
}

// runTestServer serves two tools on stdio: echo (its text, with the
// server's name) and whoami (the uid it runs as).
func runTestServer() {
	name := os.Getenv(testServerEnv)
	s := mcp.NewServer(&mcp.Implementation{Name: "test-" + name, Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes text"}, func(ctx context.Context, req *mcp.CallToolRequest, in echoArgs) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + ":" + in.Text}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "whoami", Description: "the uid"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(os.Getuid())}}}, nil, nil
	})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// testServer is a config entry that runs the test binary at bin as the
// stdio server called name.
func testServer(key, name, bin string) Server {
	owner, repo, _ := strings.Cut(strings.TrimPrefix(key, "github/"), "/")
	return Server{Key: key, Owner: owner, Repo: repo, RunCmd: `exec "$MCPGW_TEST_BIN"`,
		Envs: map[string]string{testServerEnv: name, "MCPGW_TEST_BIN": bin}}
}

// fakeClone makes an empty checkout: nothing here reaches GitHub.
func fakeClone(ctx context.Context, s Server, dir string) error { return os.Mkdir(dir, 0o755) }

func startGateway(t *testing.T, opts Options) (*Gateway, *httptest.Server) {
	t.Helper()
	if opts.Token == "" {
		opts.Token = "secret-token"
	}
	if opts.Home == "" {
		opts.Home = t.TempDir()
	}
	if opts.BaseEnv == nil {
		opts.BaseEnv = os.Environ()
	}
	if opts.Clone == nil {
		opts.Clone = fakeClone
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	hs := httptest.NewServer(g.Handler())
	t.Cleanup(hs.Close)
	return g, hs
}

// bearer adds the token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func connect(t *testing.T, url, token string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: bearer{token}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callText(t *testing.T, cs *mcp.ClientSession, name string, args any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("calling %s: %v", name, err)
	}
	if res.IsError || len(res.Content) != 1 {
		t.Fatalf("calling %s: %+v", name, res)
	}
	return res.Content[0].(*mcp.TextContent).Text
}

func TestGatewayPrefixesAndForwardsTools(t *testing.T) {
	bin := os.Args[0]
	_, hs := startGateway(t, Options{Servers: []Server{
		testServer("github/acme/alpha", "alpha", bin),
		testServer("github/acme/beta.js", "beta", bin),
	}})
	cs := connect(t, hs.URL, "secret-token")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	want := "github-acme-alpha__echo github-acme-alpha__whoami github-acme-beta.js__echo github-acme-beta.js__whoami"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("tools: %s\nwant:  %s", got, want)
	}
	// Each prefixed name reaches its own server, under the tool's own name.
	if got := callText(t, cs, "github-acme-beta.js__echo", map[string]any{"text": "hi"}); got != "beta:hi" {
		t.Fatalf("beta echo: %q", got)
	}
	if got := callText(t, cs, "github-acme-alpha__echo", map[string]any{"text": "yo"}); got != "alpha:yo" {
		t.Fatalf("alpha echo: %q", got)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "x"}}); err == nil {
		t.Fatal("the unprefixed name was served")
	}
}

func TestGatewayRefusesRequestsWithoutTheToken(t *testing.T) {
	_, hs := startGateway(t, Options{Servers: []Server{testServer("github/acme/alpha", "alpha", os.Args[0])}})
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for name, auth := range map[string]string{
		"none":         "",
		"wrong":        "Bearer secret-tokeN",
		"prefix":       "Bearer secret-toke",
		"longer":       "Bearer secret-token2",
		"not bearer":   "Basic secret-token",
		"token alone":  "secret-token",
		"empty bearer": "Bearer ",
	} {
		req, _ := http.NewRequest("POST", hs.URL+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, resp.StatusCode)
		}
	}
	// The right token is let in (the same request).
	req, _ := http.NewRequest("POST", hs.URL+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer secret-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("right token: status %d", resp.StatusCode)
	}
}

func TestGatewayRunsServersAsTheGivenUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test needs root (as CI has)")
	}
	// nobody must be able to run the test binary and enter its home.
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755) // t.TempDir's parent is root's only
	bin := filepath.Join(dir, "server")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	os.Mkdir(home, 0o755)
	os.Chown(home, 65534, 65534)
	_, hs := startGateway(t, Options{
		Servers:    []Server{testServer("github/acme/alpha", "alpha", bin)},
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534},
		Home:       home,
		BaseEnv:    []string{"PATH=/usr/bin:/bin", "HOME=" + home},
		Clone: func(ctx context.Context, s Server, dir string) error {
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
			return os.Chown(dir, 65534, 65534)
		},
	})
	cs := connect(t, hs.URL, "secret-token")
	if got := callText(t, cs, "github-acme-alpha__whoami", map[string]any{}); got != "65534" {
		t.Fatalf("the server runs as uid %s, want 65534", got)
	}
	fi, err := os.Stat(filepath.Join(home, "mcp-servers", "acme"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 {
		t.Fatalf("the checkout's parent is owned by %d", st.Uid)
	}
}

func TestGatewayStartErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		server Server
		want   string
	}{
		"not an MCP server": {Server{Key: "github/a/b", Owner: "a", Repo: "b", RunCmd: "echo not-json"}, "did not start an MCP server"},
		"command missing":   {Server{Key: "github/a/b", Owner: "a", Repo: "b", RunCmd: "exec /nonexistent/server"}, "did not start an MCP server"},
		"install fails":     {Server{Key: "github/a/b", Owner: "a", Repo: "b", InstallCmd: "exit 3", RunCmd: "true"}, "installCmd failed"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := Start(ctx, Options{Servers: []Server{tc.server}, Token: "t", Home: t.TempDir(), BaseEnv: os.Environ(), Clone: fakeClone})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"github/a/b"`) {
				t.Fatalf("error %v, want one naming the server and %q", err, tc.want)
			}
		})
	}
	// A failed clone leaves nothing behind for the next start to take as
	// a checkout.
	home := t.TempDir()
	_, err := Start(context.Background(), Options{Servers: []Server{{Key: "github/a/b", Owner: "a", Repo: "b", RunCmd: "true"}}, Token: "t", Home: home,
		Clone: func(ctx context.Context, s Server, dir string) error {
			os.Mkdir(dir, 0o755)
			return fmt.Errorf("no route")
		}})
	if err == nil || !strings.Contains(err.Error(), "cloning github.com/a/b") {
		t.Fatalf("clone error: %v", err)
	}
	if _, err := os.Stat(filepath.Join(home, "mcp-servers", "a", "b")); !os.IsNotExist(err) {
		t.Fatalf("a failed clone left its directory: %v", err)
	}
	if _, err := Start(context.Background(), Options{Token: ""}); err == nil {
		t.Fatal("an empty token was accepted")
	}
}
