package envd

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/warren-sandbox/warren/internal/envd/reaper"
	"github.com/warren-sandbox/warren/internal/envd/settings"
	fspb "github.com/warren-sandbox/warren/proto/envd/filesystem"
	procpb "github.com/warren-sandbox/warren/proto/envd/process"
)

var (
	reaperOnce sync.Once
	testReaper *reaper.Reaper
	reaperErr  error
)

// newTestServer serves a whole envd over loopback with token ("" for
// none); open also passes --insecure-no-token.
func newTestServer(t *testing.T, token string, open bool) (*httptest.Server, *settings.Settings) {
	t.Helper()
	reaperOnce.Do(func() { testReaper, reaperErr = reaper.Start() })
	if reaperErr != nil {
		t.Fatal(reaperErr)
	}
	s := settings.New("root", "", token)
	if open {
		s.AllowNoToken()
	}
	srv := New(s, testReaper, slog.New(slog.DiscardHandler))
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return hs, s
}

// route is one request to envd. Every one is harmless when it gets
// through: paths are under dir, pids do not exist.
type route struct {
	name        string
	method, url string // url is relative to the server
	contentType string
	body        string
	stream      bool // a Connect streaming call: the body is enveloped
}

// rpcBodies holds a harmless request of every Connect RPC envd serves,
// by full method name; %s is the test's directory. A method missing here
// fails the test, so a new RPC cannot go untested.
var rpcBodies = map[string]string{
	"filesystem.Filesystem.Stat":             `{"path":"%s/none"}`,
	"filesystem.Filesystem.MakeDir":          `{"path":"%s/made"}`,
	"filesystem.Filesystem.Move":             `{"source":"%s/none","destination":"%s/moved"}`,
	"filesystem.Filesystem.ListDir":          `{"path":"%s"}`,
	"filesystem.Filesystem.Remove":           `{"path":"%s/none"}`,
	"filesystem.Filesystem.WatchDir":         `{"path":"%s/none"}`,
	"filesystem.Filesystem.CreateWatcher":    `{"path":"%s/none"}`,
	"filesystem.Filesystem.GetWatcherEvents": `{"watcherId":"none"}`,
	"filesystem.Filesystem.RemoveWatcher":    `{"watcherId":"none"}`,
	"process.Process.List":                   `{}`,
	"process.Process.Connect":                `{"process":{"pid":999999}}`,
	"process.Process.Start":                  `{"process":{"cmd":"/bin/sh","args":["-c","touch %s/started"]}}`,
	"process.Process.Update":                 `{"process":{"pid":999999}}`,
	"process.Process.StreamInput":            `{"start":{"process":{"pid":999999}}}`,
	"process.Process.SendInput":              `{"process":{"pid":999999},"input":{"stdin":""}}`,
	"process.Process.SendSignal":             `{"process":{"pid":999999},"signal":"SIGNAL_SIGTERM"}`,
	"process.Process.CloseStdin":             `{"process":{"pid":999999}}`,
}

// allRoutes lists every route of envd but /health.
func allRoutes(t *testing.T, dir string) []route {
	t.Helper()
	var rs []route
	for _, sd := range []protoreflect.ServiceDescriptor{
		fspb.File_envd_filesystem_proto.Services().ByName("Filesystem"),
		procpb.File_envd_process_proto.Services().ByName("Process"),
	} {
		for i := 0; i < sd.Methods().Len(); i++ {
			m := sd.Methods().Get(i)
			full := string(m.FullName())
			body, ok := rpcBodies[full]
			if !ok {
				t.Fatalf("no request for RPC %s: add one to rpcBodies", full)
			}
			stream := m.IsStreamingClient() || m.IsStreamingServer()
			ct := "application/json"
			if stream {
				ct = "application/connect+json"
			}
			rs = append(rs, route{
				name: full, method: "POST", url: "/" + string(sd.FullName()) + "/" + string(m.Name()),
				contentType: ct, body: strings.ReplaceAll(body, "%s", dir), stream: stream,
			})
		}
	}
	file := url.QueryEscape(filepath.Join(dir, "file"))
	compose, _ := json.Marshal(map[string]any{"source_paths": []string{filepath.Join(dir, "file")}, "destination": filepath.Join(dir, "composed")})
	return append(rs,
		route{name: "GET /files", method: "GET", url: "/files?path=" + file},
		route{name: "HEAD /files", method: "HEAD", url: "/files?path=" + file},
		route{name: "POST /files", method: "POST", url: "/files?path=" + url.QueryEscape(filepath.Join(dir, "uploaded")), contentType: "application/octet-stream", body: "up"},
		route{name: "POST /files/compose", method: "POST", url: "/files/compose", contentType: "application/json", body: string(compose)},
		route{name: "GET /envs", method: "GET", url: "/envs"},
		route{name: "GET /metrics", method: "GET", url: "/metrics"},
		route{name: "POST /init", method: "POST", url: "/init", contentType: "application/json", body: `{"envVars":{"SET_BY":"test"}}`},
	)
}

// call sends r with the given X-Access-Token (none when token is nil) and
// returns the status and body.
func call(t *testing.T, base string, r route, token *string) (int, []byte) {
	t.Helper()
	body := []byte(r.body)
	if r.stream {
		env := make([]byte, 5, 5+len(body))
		binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
		body = append(env, body...)
	}
	req, err := http.NewRequest(r.method, base+r.url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if token != nil {
		req.Header.Set("X-Access-Token", *token)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	t.Logf("%s (token %v): %d %.120s", r.name, token != nil, res.StatusCode, b)
	return res.StatusCode, b
}

// checkRefused wants a 401 in E2B's {"code":401,"message"} shape (HEAD:
// without a body).
func checkRefused(t *testing.T, r route, status int, body []byte) {
	t.Helper()
	what := r.name
	if r.method == "HEAD" {
		if status != http.StatusUnauthorized || len(body) != 0 {
			t.Errorf("%s: %d %s, want 401", what, status, body)
		}
		return
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if status != http.StatusUnauthorized || json.Unmarshal(body, &e) != nil || e.Code != 401 || e.Message == "" {
		t.Errorf("%s: %d %s, want 401 {code,message}", what, status, body)
	}
}

// checkServed wants anything but a refusal: the handler ran.
func checkServed(t *testing.T, what string, status int, body []byte) {
	t.Helper()
	if status == http.StatusUnauthorized || bytes.Contains(body, []byte(`"unauthenticated"`)) || status >= 500 {
		t.Errorf("%s: %d %s, want it served", what, status, body)
	}
}

func TestAuthEveryRoute(t *testing.T) {
	str := func(s string) *string { return &s }

	t.Run("no token", func(t *testing.T) {
		srv, s := newTestServer(t, "", false)
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
		routes := append(allRoutes(t, dir), route{name: "unknown path", method: "GET", url: "/no-such-route"},
			route{name: "POST /init setting a token", method: "POST", url: "/init", contentType: "application/json", body: `{"accessToken":"mine"}`})
		for _, r := range routes {
			for _, tok := range []*string{nil, str(""), str("guess")} {
				status, body := call(t, srv.URL, r, tok)
				checkRefused(t, r, status, body)
			}
		}
		if s.AccessToken() != "" || len(s.EnvVars()) != 0 {
			t.Errorf("/init got through: token %q, envs %v", s.AccessToken(), s.EnvVars())
		}
		assertUntouched(t, dir)
		assertHealth(t, srv.URL)
	})

	t.Run("token", func(t *testing.T) {
		srv, _ := newTestServer(t, "right-token", false)
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
		for _, r := range allRoutes(t, dir) {
			for _, tok := range []*string{nil, str(""), str("wrong-token"), str("right-token2"), str("Right-Token")} {
				status, body := call(t, srv.URL, r, tok)
				checkRefused(t, r, status, body)
			}
		}
		assertUntouched(t, dir)
		assertHealth(t, srv.URL)
		for _, r := range allRoutes(t, dir) {
			status, body := call(t, srv.URL, r, str("right-token"))
			checkServed(t, r.name, status, body)
		}
		for _, ran := range []string{"made", "started", "uploaded", "composed"} {
			if _, err := os.Stat(filepath.Join(dir, ran)); err != nil {
				t.Errorf("a request with the token did not run: %v", err)
			}
		}
	})

	t.Run("insecure no token", func(t *testing.T) {
		srv, _ := newTestServer(t, "", true)
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
		for _, r := range allRoutes(t, dir) {
			status, body := call(t, srv.URL, r, nil)
			checkServed(t, r.name, status, body)
		}
		assertHealth(t, srv.URL)
	})
}

// assertUntouched checks that no refused request changed dir.
func assertUntouched(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "file" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("refused requests changed %s: %v", dir, names)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "file")); string(b) != "x" {
		t.Errorf("refused requests changed the file: %q", b)
	}
}

func assertHealth(t *testing.T, base string) {
	t.Helper()
	for _, m := range []string{"GET", "HEAD"} {
		req, _ := http.NewRequest(m, base+"/health", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusNoContent {
			t.Errorf("%s /health: %d", m, res.StatusCode)
		}
	}
}

// An empty token from /init would lock envd (or open it); it is refused.
func TestInitRefusesEmptyToken(t *testing.T) {
	srv, s := newTestServer(t, "tok", false)
	tok := "tok"
	status, body := call(t, srv.URL, route{name: "init", method: "POST", url: "/init", contentType: "application/json", body: `{"accessToken":""}`}, &tok)
	if status != http.StatusBadRequest || s.AccessToken() != "tok" {
		t.Errorf("init with an empty token: %d %s, token now %q", status, body, s.AccessToken())
	}
	status, _ = call(t, srv.URL, route{name: "init", method: "POST", url: "/init", contentType: "application/json", body: `{"accessToken":"new"}`}, &tok)
	if status != http.StatusNoContent || s.AccessToken() != "new" {
		t.Errorf("init with a new token: %d, token now %q", status, s.AccessToken())
	}
}
