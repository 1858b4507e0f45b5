package security

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/templateclient"
)

// built is a finished template build.
type built struct {
	TemplateID, BuildID, Status string
	// Err is the build's error (a *templateclient.BuildError when it ended
	// in the error status).
	Err error
	// Logs are the build's log messages, with their steps.
	Logs []string
}

func (b built) log() string { return strings.Join(b.Logs, "\n") }

// stepLogs returns the log lines of one step ("1".."N").
func (b built) stepLogs(step string) string {
	var out []string
	for _, l := range b.Logs {
		if s, msg, ok := strings.Cut(l, "| "); ok && s == "["+step+"] " {
			out = append(out, msg)
		}
	}
	return strings.Join(out, "\n")
}

// buildDockerfile builds a Dockerfile (files: the context, name → content)
// as tm, the way `warren template build` and the SDK do.
func buildDockerfile(t *testing.T, tm team, name, dockerfile string, files map[string]string) built {
	t.Helper()
	dir := t.TempDir()
	for n, content := range files {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := templateclient.New(S.srv.apiURL, tm.key)
	var b built
	res, err := c.Build(ctx, templateclient.BuildOptions{Name: name, Dockerfile: dockerfile, ContextDir: dir,
		Progress: func(e templateclient.Event) {
			if e.Message != "" {
				b.Logs = append(b.Logs, fmt.Sprintf("[%s] | %s", e.Step, e.Message))
			}
		}})
	b.TemplateID, b.BuildID, b.Status, b.Err = res.TemplateID, res.BuildID, res.Status, err
	var be *templateclient.BuildError
	var ae *templateclient.APIError
	switch {
	case err == nil, errors.As(err, &be):
	case errors.As(err, &ae):
		if ae.StatusCode == http.StatusInternalServerError && !opaque500.MatchString(ae.Message) {
			t.Errorf("a 500 body leaks the internal error: %v", ae)
		}
	default:
		t.Fatalf("building %s: %v", name, err)
	}
	if res.TemplateID != "" {
		t.Cleanup(func() { deleteTemplate(t, tm, res.TemplateID) })
	}
	return b
}

// mustBuild builds and fails the test unless the build is ready.
func mustBuild(t *testing.T, tm team, name, dockerfile string, files map[string]string) built {
	t.Helper()
	b := buildDockerfile(t, tm, name, dockerfile, files)
	if b.Err != nil {
		t.Fatalf("building %s: %v\n%s", name, b.Err, b.log())
	}
	return b
}

func deleteTemplate(t *testing.T, tm team, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := S.srv.call(ctx, tm, "DELETE", "/templates/"+id, nil)
	if err != nil || (r.Status != http.StatusNoContent && r.Status != http.StatusNotFound) {
		t.Errorf("deleting template %s: %v %v", id, err, r)
	}
}

// rawBuild is a template build driven by hand, for attacks in the wire
// format: the uploaded archive, the steps' filesHash.
type rawBuild struct {
	tm                  team
	TemplateID, BuildID string
}

// newRawBuild creates a template (POST /v3/templates) and its waiting
// build. body may set cpuCount, memoryMB.
func newRawBuild(t *testing.T, tm team, name string, body map[string]any) (*rawBuild, apiResponse) {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	body["name"] = name
	r, err := S.srv.call(context.Background(), tm, "POST", "/v3/templates", body)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusAccepted {
		return nil, r
	}
	var out struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	if err := r.decode(&out); err != nil {
		t.Fatal(err)
	}
	rb := &rawBuild{tm: tm, TemplateID: out.TemplateID, BuildID: out.BuildID}
	t.Cleanup(func() { deleteTemplate(t, tm, rb.TemplateID) })
	return rb, r
}

// uploadURL asks for the signed upload URL of hash.
func (rb *rawBuild) uploadURL(t *testing.T, hash string) (present bool, u string) {
	t.Helper()
	r, err := S.srv.call(context.Background(), rb.tm, "GET", "/templates/"+rb.TemplateID+"/files/"+hash, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusCreated {
		t.Fatalf("GET files/%s: %s", hash, r)
	}
	var out struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if err := r.decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Present, out.URL
}

// upload PUTs archive to the signed URL of hash, with no API key, as the
// SDK does.
func (rb *rawBuild) upload(t *testing.T, hash string, archive []byte) apiResponse {
	t.Helper()
	_, u := rb.uploadURL(t, hash)
	req, err := http.NewRequest("PUT", u, bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// step is a build step in the API's shape.
type step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// start starts the build (POST /v2/templates/{id}/builds/{buildID}).
func (rb *rawBuild) start(t *testing.T, fromTemplate string, steps []step) apiResponse {
	t.Helper()
	body := map[string]any{"fromTemplate": fromTemplate, "steps": steps}
	r, err := S.srv.call(context.Background(), rb.tm, "POST", "/v2/templates/"+rb.TemplateID+"/builds/"+rb.BuildID, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wait polls the build's status until it ends and returns it with its logs.
func (rb *rawBuild) wait(t *testing.T) built {
	t.Helper()
	b := built{TemplateID: rb.TemplateID, BuildID: rb.BuildID}
	offset := 0
	ended := poll.Within(4*time.Minute, 150*time.Millisecond, func() bool {
		r, err := S.srv.call(context.Background(), rb.tm, "GET",
			"/templates/"+rb.TemplateID+"/builds/"+rb.BuildID+"/status?logsOffset="+strconv.Itoa(offset), nil)
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Status     string `json:"status"`
			LogEntries []struct {
				Message string `json:"message"`
				Step    string `json:"step"`
			} `json:"logEntries"`
			Reason *struct {
				Message string `json:"message"`
				Step    string `json:"step"`
			} `json:"reason"`
		}
		if r.Status != http.StatusOK {
			t.Fatalf("build status: %s", r)
		}
		if err := r.decode(&st); err != nil {
			t.Fatal(err)
		}
		for _, e := range st.LogEntries {
			b.Logs = append(b.Logs, fmt.Sprintf("[%s] | %s", e.Step, e.Message))
		}
		offset += len(st.LogEntries)
		if (st.Status == "ready" || st.Status == "error") && len(st.LogEntries) == 0 {
			b.Status = st.Status
			if st.Status == "error" {
				msg := "unknown error"
				if st.Reason != nil {
					msg = fmt.Sprintf("step %s: %s", st.Reason.Step, st.Reason.Message)
				}
				b.Err = errors.New(msg)
			}
			return true
		}
		return false
	})
	if !ended {
		t.Fatalf("build %s did not end within 4 minutes", rb.BuildID)
	}
	return b
}

// templateLayers reads the layer IDs of a finished build from the data
// dir (templates/<buildID>.json).
func templateLayers(t *testing.T, buildID string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(S.srv.dataDir, "templates", buildID+".json"))
	if err != nil {
		t.Fatalf("the build's template on disk: %v", err)
	}
	var tpl struct {
		Layers []string `json:"layers"`
	}
	if err := json.Unmarshal(raw, &tpl); err != nil {
		t.Fatal(err)
	}
	return tpl.Layers
}

// ownLayers are the layers a build made on top of the base template.
func ownLayers(t *testing.T, buildID string) []string {
	var out []string
	for _, l := range templateLayers(t, buildID) {
		if !strings.HasPrefix(l, "base-") {
			out = append(out, l)
		}
	}
	return out
}

// removeLayers deletes layers from the data dir: what a case built must not
// weigh on the next (cached layers stay on disk otherwise).
func removeLayers(t *testing.T, layers []string) {
	for _, l := range layers {
		if strings.HasPrefix(l, "base-") || strings.ContainsAny(l, "/") || l == "" {
			continue
		}
		os.RemoveAll(filepath.Join(S.srv.dataDir, "layers", l))
	}
}

// query builds a URL query.
func query(kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return q.Encode()
}
