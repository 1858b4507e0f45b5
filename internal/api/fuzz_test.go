package api

import (
	"encoding/json"
	"maps"
	"net/url"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// The fuzz targets feed tenant input through the real handlers (with the
// fakes of fakes_test.go): whatever comes in, the answer is a success or
// a well-formed client error, never a 500 (a panic would be one, turned
// so by recoverPanics), and what reaches the manager is valid.

// checkAnswer fails on a 500 or an error body of another shape.
func checkAnswer(t *testing.T, hs *harness, what string, status int, body []byte) {
	t.Helper()
	if status >= 500 {
		t.Fatalf("%s: %d %s\nlog: %s", what, status, body, hs.log.String())
	}
	if status >= 400 {
		var e struct {
			Code    *int    `json:"code"`
			Message *string `json:"message"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Code == nil || *e.Code != status || e.Message == nil || *e.Message == "" {
			t.Fatalf("%s: error body %q for %d", what, body, status)
		}
	}
}

func FuzzCreateSandboxBody(f *testing.F) {
	for _, seed := range []string{
		`{"templateID":"base"}`,
		`{"templateID":"base","timeout":86400,"metadata":{"a b":"c&d=e"},"envVars":{"X":"1"},"autoPause":true,"autoResume":{"enabled":true}}`,
		`{"templateID":"base","timeout":-1}`,
		`{"templateID":"base","timeout":2147483647}`,
		`{"templateID":""}`,
		`{"templateID":"base","network":{"allowPublicTraffic":false,"maskRequestHost":"x:${PORT}","allowOut":["1.2.3.4"]}}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/x"}],"mcp":{"a":[1,2,{}]}}`,
		`{"templateID":"base","allow_internet_access":false,"secure":"yes"}`,
		`{"templateID":1}`, `[]`, `null`, `"x"`, ``, `{`, "{\"templateID\":\"\u0000\"}",
		`{"templateID":"base","metadata":{"k":null}}`,
	} {
		f.Add(seed)
	}
	hs := newHarness(f, Config{})
	var got []sandbox.CreateRequest
	hs.sandboxes.create = func(req sandbox.CreateRequest) (store.Sandbox, error) {
		got = append(got, req)
		return store.Sandbox{ID: "sbx1", TemplateID: req.TemplateID}, nil
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			got = got[:0]
			w := hs.do("POST", path, keyTeam1, body)
			checkAnswer(t, hs, path+" "+body, w.Code, w.Body.Bytes())
			for _, req := range got {
				if req.TemplateID == "" || req.TeamID.String() != "t1" || req.Timeout < 0 || req.Timeout > MaxTimeout {
					t.Fatalf("%s %q reached the manager as %+v", path, body, req)
				}
			}
			if w.Code == 201 && len(got) != 1 {
				t.Fatalf("201 without a create: %q", body)
			}
		}
	})
}

func FuzzTemplateBodies(f *testing.F) {
	routes := []struct{ method, path string }{
		{"POST", "/v3/templates"},
		{"POST", "/v2/templates/tpl1/builds/b1"},
		{"POST", "/templates/tpl1"},
		{"POST", "/templates/tags"},
		{"DELETE", "/templates/tags"},
	}
	for i, seed := range []string{
		`{"name":"my-app:v1","tags":["a","b"],"cpuCount":2,"memoryMB":1024}`,
		`{"alias":"x","cpuCount":0,"memoryMB":127}`,
		`{"fromImage":"debian:12","fromImageRegistry":{"type":"registry","username":"u","password":"p"},"steps":[{"type":"RUN","args":["echo hi"],"force":true},{"type":"COPY","args":["a","/b"],"filesHash":"` + strings.Repeat("a", 64) + `"}],"startCmd":"x","readyCmd":"y"}`,
		`{"fromTemplate":"base","steps":[{"type":"RUN"},null]}`,
		`{"dockerfile":"FROM base\nRUN echo","cpuCount":2147483647,"memoryMB":-2147483648}`,
		`{"dockerfile":"   "}`,
		`{"target":"tpl1:v1","tags":["v2"]}`,
		`{"name":"tpl1","tags":[]}`,
		`{"steps":{}}`, `{"tags":"x"}`, `null`, ``, `{"cpuCount":1e99}`,
	} {
		f.Add(uint8(i), seed)
	}
	hs := newHarness(f, Config{NodeCPUs: 2, NodeMemoryMB: 4096})
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		r := routes[int(route)%len(routes)]
		w := hs.do(r.method, r.path, keyTeam1, body)
		checkAnswer(t, hs, r.method+" "+r.path+" "+body, w.Code, w.Body.Bytes())
	})
}

// sdkMetadata encodes a filter as the SDK sends it, after the HTTP
// stack's own decoding: each key and value percent-encoded twice.
func sdkMetadata(m map[string]string) string {
	var pairs []string
	for k, v := range m {
		pairs = append(pairs, url.QueryEscape(url.QueryEscape(k))+"="+url.QueryEscape(url.QueryEscape(v)))
	}
	return strings.Join(pairs, "&")
}

func FuzzMetadataFilter(f *testing.F) {
	for _, seed := range []struct{ raw, k, v string }{
		{"a%2520b=c%2526d%253De&user=x", "a b", "c&d=e"},
		{"k=v", "k", ""},
		{"=v", "=", "&"},
		{"k=v&k=w", "%", "%25"},
		{"%zz=1", "é", "\x00"},
		{"a=b=c", "+", " "},
		{strings.Repeat("k=v&", 70) + "k=v", "k", "v"},
	} {
		f.Add(seed.raw, seed.k, seed.v)
	}
	f.Fuzz(func(t *testing.T, raw, k, v string) {
		m, err := parseMetadata(&raw)
		if err == nil {
			if len(m) > maxMetadataPairs {
				t.Fatalf("%q: %d pairs", raw, len(m))
			}
			for key := range m {
				if key == "" {
					t.Fatalf("%q: an empty key", raw)
				}
			}
		}
		if k == "" {
			return
		}
		want := map[string]string{k: v, "other": "x"}
		enc := sdkMetadata(want)
		got, err := parseMetadata(&enc)
		if err != nil || !maps.Equal(got, want) {
			t.Fatalf("round trip of %q: %v %v (sent %q)", want, got, err, enc)
		}
	})
}

func TestMetadataFilter(t *testing.T) {
	for raw, ok := range map[string]bool{
		"a%2520b=c%2526d%253De&user=x":    true,
		"k=":                              true,
		"=v":                              false,
		"k=v&k=w":                         false,
		"a=b=c":                           false,
		"%zz=1":                           false,
		strings.Repeat("k=v&", 64) + "z=": false,
	} {
		if _, err := parseMetadata(&raw); (err == nil) != ok {
			t.Errorf("%q: %v", raw, err)
		}
	}
	hs := newHarness(t, Config{})
	w := hs.do("GET", "/v2/sandboxes?metadata="+url.QueryEscape("=v"), keyTeam1, "")
	if code, _ := errorBody(t, w); code != 400 {
		t.Errorf("an empty key over HTTP: %d", code)
	}

}
