package api

import (
	"encoding/json"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
)

// schemaFacts are what testdata/e2b-required.json pins of E2B's spec.
type schemaFacts struct {
	Required []string          `json:"required"`
	Nullable []string          `json:"nullable"`
	Objects  map[string]string `json:"objects"`
	Arrays   map[string]string `json:"arrays"`
}

func loadFacts(t *testing.T) map[string]schemaFacts {
	t.Helper()
	b, err := os.ReadFile("testdata/e2b-required.json")
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	out := map[string]schemaFacts{}
	for name, v := range raw {
		if name[0] == '_' {
			continue
		}
		var f schemaFacts
		if err := json.Unmarshal(v, &f); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = f
	}
	return out
}

// conform checks a decoded JSON value against schema's facts: every
// required field present, and not null unless nullable; nested schemas
// likewise. It is the strict reading E2B's Python SDK does (a KeyError
// for a missing field).
func conform(t *testing.T, facts map[string]schemaFacts, where, schema string, v any) {
	t.Helper()
	f, ok := facts[schema]
	if !ok {
		t.Fatalf("no facts for schema %s", schema)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		t.Errorf("%s: %s is not an object: %v", where, schema, v)
		return
	}
	for _, name := range f.Required {
		val, present := obj[name]
		if !present {
			t.Errorf("%s: %s lacks required field %q: %v", where, schema, name, obj)
			continue
		}
		if val == nil && !contains(f.Nullable, name) {
			t.Errorf("%s: %s.%s is null, which the spec does not allow", where, schema, name)
		}
	}
	for name, sub := range f.Objects {
		if val, ok := obj[name]; ok && val != nil {
			conform(t, facts, where+"."+name, sub, val)
		}
	}
	for name, sub := range f.Arrays {
		if list, ok := obj[name].([]any); ok {
			for _, item := range list {
				conform(t, facts, where+"."+name+"[]", sub, item)
			}
		}
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestAnswersHaveE2BsRequiredFields sends each request whose answer has a
// schema in E2B's spec and checks the answer against that schema's facts.
func TestAnswersHaveE2BsRequiredFields(t *testing.T) {
	facts := loadFacts(t)
	hs, creds := accountHarness(t)
	key, tok := creds["t1"][0], creds["t1"][1]
	now := time.Now()
	rec := store.Sandbox{ID: "sbx1", TeamID: "t1", TemplateID: "base", Alias: "base", State: store.StateRunning,
		StartedAt: now, EndAt: now.Add(time.Minute), CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024, EnvdVersion: "0.2.0"}
	hs.sandboxes.create = func(sandbox.CreateRequest) (store.Sandbox, error) { return rec, nil }
	hs.sandboxes.get = func(string, string) (store.Sandbox, error) { return rec, nil }
	hs.sandboxes.metrics = []sandbox.Metric{{Time: now, CPUCount: 2, CPUUsedPct: 1.5, MemUsed: 1 << 20, MemTotal: 512 << 20}}
	tpl := template.TemplateInfo{
		Template: store.Template{ID: "tpl1", TeamID: "t1", Names: []string{"app"}, CPUCount: 2, MemoryMB: 512, CreatedAt: now, UpdatedAt: now, BuildCount: 1},
		Builds:   []store.Build{{ID: "b1", TemplateID: "tpl1", Status: store.BuildReady, CPUCount: 2, MemoryMB: 512, CreatedAt: now, UpdatedAt: now}},
	}
	hs.templates.info = &tpl

	calls := []struct {
		method, path, body string
		auth               string // "key" or "token"
		status             int
		schema             string
		array              bool
	}{
		{"POST", "/sandboxes", `{"templateID":"base"}`, "key", 201, "Sandbox", false},
		{"POST", "/v2/sandboxes", `{"templateID":"base"}`, "key", 201, "Sandbox", false},
		{"POST", "/sandboxes/sbx1/connect", `{"timeout":10}`, "key", 200, "Sandbox", false},
		{"GET", "/sandboxes/sbx1", "", "key", 200, "SandboxDetail", false},
		{"GET", "/sandboxes/sbx1/metrics", "", "key", 200, "SandboxMetric", true},
		{"GET", "/sandboxes/sbx1/logs", "", "key", 200, "SandboxLogs", false},
		{"GET", "/templates", "", "key", 200, "Template", true},
		{"GET", "/v2/templates", "", "key", 200, "Template", true},
		{"GET", "/templates/tpl1", "", "key", 200, "TemplateWithBuilds", false},
		{"POST", "/templates", `{"dockerfile":"FROM base","alias":"app"}`, "token", 202, "TemplateLegacy", false},
		{"POST", "/v2/templates", `{"alias":"app"}`, "key", 202, "TemplateLegacy", false},
		{"POST", "/templates/tpl1", `{"dockerfile":"FROM base"}`, "token", 202, "TemplateLegacy", false},
		{"POST", "/v3/templates", `{"name":"app"}`, "key", 202, "TemplateRequestResponseV3", false},
		{"PATCH", "/v2/templates/tpl1", `{"public":true}`, "key", 200, "TemplateUpdateResponse", false},
		{"GET", "/teams", "", "token", 200, "Team", true},
		{"GET", "/api-keys", "", "token", 200, "TeamAPIKey", true},
		{"POST", "/api-keys", `{"name":"x"}`, "token", 201, "CreatedTeamAPIKey", false},
		{"GET", "/sandboxes/sbx1/nope", "", "key", 404, "Error", false},
	}
	for _, c := range calls {
		var hdr []string
		k := key
		if c.auth == "token" {
			k, hdr = "", bearer(tok)
		}
		w := hs.do(c.method, c.path, k, c.body, hdr...)
		where := c.method + " " + c.path
		if w.Code != c.status {
			t.Errorf("%s: status %d, want %d: %s", where, w.Code, c.status, w.Body)
			continue
		}
		var v any
		if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if !c.array {
			conform(t, facts, where, c.schema, v)
			continue
		}
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			t.Errorf("%s: want a non-empty array, got %s", where, w.Body)
			continue
		}
		for _, item := range list {
			conform(t, facts, where, c.schema, item)
		}
	}
	_ = http.StatusOK
}
