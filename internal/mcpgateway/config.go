package mcpgateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Limits on a config. It is tenant input: the SDK passes the `mcp` option
// of Sandbox.create through unchanged.
const (
	MaxConfigBytes  = 64 << 10
	MaxServers      = 16
	MaxCommandBytes = 4 << 10
	MaxEnvs         = 64
	MaxEnvBytes     = 8 << 10
	// MaxToolsPerServer bounds what one server may register.
	MaxToolsPerServer = 256
)

// Server is one MCP server a config names: a custom server from a GitHub
// repository (the key github/<owner>/<repo>), run by RunCmd as a stdio
// child.
type Server struct {
	// Key is the config's key, e.g. "github/acme/tools".
	Key string
	// Owner and Repo name the GitHub repository.
	Owner, Repo string
	InstallCmd  string
	RunCmd      string
	Envs        map[string]string
}

// Prefix is what the gateway puts before the names of this server's
// tools: the key with every character that a tool name may not hold
// turned into '-' (github/acme/tools -> github-acme-tools).
func (s Server) Prefix() string {
	var b strings.Builder
	for _, r := range s.Key {
		if r < 0x80 && (r == '_' || r == '-' || r == '.' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// ToolSeparator joins a server's prefix and its tool's name.
const ToolSeparator = "__"

// ExposedName is the name under which the gateway serves a tool.
func (s Server) ExposedName(tool string) string { return s.Prefix() + ToolSeparator + tool }

// GitHub's owner and repository name characters.
var githubName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,100}$`)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// supported is said in every refusal of a server, so that a user learns
// what the gateway does run.
const supported = `Warren's mcp-gateway runs custom servers only: a key "github/<owner>/<repo>" with {"runCmd": "...", "installCmd": "...", "envs": {...}}, whose runCmd starts a stdio MCP server (for example "npx -y <package>" or "python3 server.py"); servers of the Docker MCP Catalog need Docker images, which Warren's sandboxes do not run`

// ParseConfig reads and checks a gateway config: a JSON object from
// server key to server settings, as the SDK's `mcp` option has it.
// Servers come back in key order.
func ParseConfig(data []byte) ([]Server, error) {
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("config is %d bytes; at most %d", len(data), MaxConfigBytes)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("config is not a JSON object of servers: %v", err)
	}
	if raw == nil {
		return nil, fmt.Errorf("config is not a JSON object of servers")
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("config names no server; %s", supported)
	}
	if len(raw) > MaxServers {
		return nil, fmt.Errorf("config names %d servers; at most %d", len(raw), MaxServers)
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	servers := make([]Server, 0, len(keys))
	prefixes := map[string]string{}
	for _, k := range keys {
		s, err := parseServer(k, raw[k])
		if err != nil {
			return nil, err
		}
		if other, ok := prefixes[s.Prefix()]; ok {
			return nil, fmt.Errorf("servers %q and %q would both prefix their tools with %q", other, k, s.Prefix())
		}
		prefixes[s.Prefix()] = k
		servers = append(servers, s)
	}
	return servers, nil
}

func parseServer(key string, raw json.RawMessage) (Server, error) {
	owner, repo, ok := strings.Cut(strings.TrimPrefix(key, "github/"), "/")
	if !strings.HasPrefix(key, "github/") {
		return Server{}, fmt.Errorf("server %q is not supported: %s", clip(key), supported)
	}
	if !ok || !githubName.MatchString(owner) || !githubName.MatchString(repo) || repo == "." || repo == ".." || owner == "." || owner == ".." {
		return Server{}, fmt.Errorf("server %q: a custom server's key is github/<owner>/<repo> with letters, digits, '-', '_' and '.'", clip(key))
	}
	var settings struct {
		RunCmd     *string           `json:"runCmd"`
		InstallCmd string            `json:"installCmd"`
		Envs       map[string]string `json:"envs"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&settings); err != nil {
		return Server{}, fmt.Errorf("server %q: settings must be {\"runCmd\", \"installCmd\", \"envs\"}: %v", key, err)
	}
	s := Server{Key: key, Owner: owner, Repo: repo, InstallCmd: settings.InstallCmd, Envs: settings.Envs}
	if settings.RunCmd == nil || strings.TrimSpace(*settings.RunCmd) == "" {
		return Server{}, fmt.Errorf("server %q: runCmd is required: the command that starts its stdio MCP server", key)
	}
	s.RunCmd = *settings.RunCmd
	for what, cmd := range map[string]string{"runCmd": s.RunCmd, "installCmd": s.InstallCmd} {
		if len(cmd) > MaxCommandBytes {
			return Server{}, fmt.Errorf("server %q: %s is %d bytes; at most %d", key, what, len(cmd), MaxCommandBytes)
		}
		if strings.IndexByte(cmd, 0) >= 0 {
			return Server{}, fmt.Errorf("server %q: %s holds a NUL byte", key, what)
		}
	}
	if len(s.Envs) > MaxEnvs {
		return Server{}, fmt.Errorf("server %q: %d envs; at most %d", key, len(s.Envs), MaxEnvs)
	}
	for name, value := range s.Envs {
		if !envName.MatchString(name) {
			return Server{}, fmt.Errorf("server %q: env name %q: letters, digits and '_', not starting with a digit", key, clip(name))
		}
		if len(value) > MaxEnvBytes || strings.IndexByte(value, 0) >= 0 {
			return Server{}, fmt.Errorf("server %q: env %s: at most %d bytes and no NUL byte", key, name, MaxEnvBytes)
		}
	}
	return s, nil
}

// clip keeps a quoted piece of input short in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
