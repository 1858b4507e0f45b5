package mcpgateway

import (
	"fmt"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	servers, err := ParseConfig([]byte(`{
		"github/modelcontextprotocol/servers": {"installCmd": "npm install", "runCmd": "npx -y @modelcontextprotocol/server-memory", "envs": {"A_KEY": "v"}},
		"github/acme/x.y": {"runCmd": "python3 server.py"}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 2 || servers[0].Key != "github/acme/x.y" || servers[1].Owner != "modelcontextprotocol" || servers[1].Repo != "servers" ||
		servers[1].InstallCmd != "npm install" || servers[1].Envs["A_KEY"] != "v" {
		t.Fatalf("%+v", servers)
	}
	if got := servers[1].ExposedName("create_entities"); got != "github-modelcontextprotocol-servers__create_entities" {
		t.Fatalf("exposed name %q", got)
	}
}

func TestParseConfigRefuses(t *testing.T) {
	many := map[string]string{}
	var b strings.Builder
	b.WriteString("{")
	for i := range MaxServers + 1 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"github/a/r%d": {"runCmd": "x"}`, i)
		many[fmt.Sprint(i)] = ""
	}
	b.WriteString("}")
	for name, tc := range map[string]struct{ config, want string }{
		"catalog server":      {`{"exa": {"apiKey": "k"}}`, `server "exa" is not supported: Warren's mcp-gateway runs custom servers only: a key "github/<owner>/<repo>"`},
		"catalog says docker": {`{"browserbase": {}}`, "Docker images"},
		"not an object":       {`[1]`, "not a JSON object"},
		"null":                {`null`, "not a JSON object"},
		"empty":               {`{}`, "names no server"},
		"no runCmd":           {`{"github/a/b": {"installCmd": "npm i"}}`, "runCmd is required"},
		"blank runCmd":        {`{"github/a/b": {"runCmd": "  "}}`, "runCmd is required"},
		"unknown field":       {`{"github/a/b": {"runCmd": "x", "user": "root"}}`, `unknown field "user"`},
		"settings not object": {`{"github/a/b": "npx x"}`, "settings must be"},
		"owner dotdot":        {`{"github/../b": {"runCmd": "x"}}`, "github/<owner>/<repo>"},
		"repo dotdot":         {`{"github/a/..": {"runCmd": "x"}}`, "github/<owner>/<repo>"},
		"nested path":         {`{"github/a/b/c": {"runCmd": "x"}}`, "github/<owner>/<repo>"},
		"no repo":             {`{"github/a": {"runCmd": "x"}}`, "github/<owner>/<repo>"},
		"slash in repo":       {`{"github/a/b\/..\/..\/etc": {"runCmd": "x"}}`, "github/<owner>/<repo>"},
		"bad env name":        {`{"github/a/b": {"runCmd": "x", "envs": {"LD_PRELOAD=x": "y"}}}`, "env name"},
		"NUL in env":          {`{"github/a/b": {"runCmd": "x", "envs": {"A": "a\u0000b"}}}`, "NUL"},
		"NUL in runCmd":       {`{"github/a/b": {"runCmd": "x\u0000y"}}`, "NUL"},
		"long runCmd":         {`{"github/a/b": {"runCmd": "` + strings.Repeat("x", MaxCommandBytes+1) + `"}}`, "runCmd is"},
		"too many servers":    {b.String(), "at most 16"},
		"too big":             {`{"github/a/b": {"runCmd": "` + strings.Repeat("x", MaxConfigBytes) + `"}}`, "bytes; at most"},
		"same prefix":         {`{"github/a/b": {"runCmd": "x"}, "github/a-b/c": {"runCmd": "x"}, "github/a/b-c": {"runCmd": "x"}}`, "would both prefix"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.config))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}
