package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/template"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// The handlers are tested through New with fakes of the store (keys
// only), the sandbox manager and the builder: no node, no database.

const (
	keyTeam1 = "e2b_1111111111111111111111111111111111111111"
	keyTeam2 = "e2b_2222222222222222222222222222222222222222"
)

// fakeStore knows two API keys; every other method panics (nil embed).
type fakeStore struct {
	store.Store
	err error // returned by KeyByHash when set
}

func (f fakeStore) KeyByHash(_ context.Context, kind store.KeyKind, hash string) (store.Key, error) {
	if f.err != nil {
		return store.Key{}, f.err
	}
	for key, team := range map[string]string{keyTeam1: "t1", keyTeam2: "t2"} {
		if kind == store.KindAPIKey && hash == auth.Hash(key) {
			return store.Key{ID: "k-" + team, TeamID: team, Kind: kind}, nil
		}
	}
	return store.Key{}, store.ErrNotFound
}

// fakeSandboxes records calls and answers with its functions.
type fakeSandboxes struct {
	mu     sync.Mutex
	calls  []string
	create func(sandbox.CreateRequest) (store.Sandbox, error)
	// The lifecycle calls answer with these when set; they record the
	// arguments they were given in last.
	pause   func(teamID, id string, memory bool) (bool, error)
	resume  func(teamID, id string, opts sandbox.ResumeOptions) (store.Sandbox, error)
	fork    func(teamID, id string, timeout time.Duration, count int) ([]sandbox.ForkResult, error)
	connect func(teamID, id string) (store.Sandbox, bool, error)
	metrics []sandbox.Metric
	last    []any
	get     func(teamID, id string) (store.Sandbox, error)
	update  func(teamID, id string, u sandbox.NetworkUpdate) error
	logs    []sandbox.LogEntry
	network []egress.Entry
}

func (f *fakeSandboxes) called(name string) {
	f.mu.Lock()
	f.calls = append(f.calls, name)
	f.mu.Unlock()
}

func (f *fakeSandboxes) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeSandboxes) Create(_ context.Context, req sandbox.CreateRequest) (store.Sandbox, error) {
	f.called("Create")
	if f.create != nil {
		return f.create(req)
	}
	now := time.Now()
	return store.Sandbox{ID: "sbx1", TeamID: req.TeamID.String(), TemplateID: req.TemplateID, State: store.StateRunning, StartedAt: now, EndAt: now.Add(req.Timeout)}, nil
}

func (f *fakeSandboxes) Get(_ context.Context, tid team.ID, id string) (store.Sandbox, error) {
	teamID := tid.String()
	f.called("Get")
	if f.get != nil {
		return f.get(teamID, id)
	}
	return store.Sandbox{}, sandbox.ErrNotFound
}

func (f *fakeSandboxes) UpdateNetwork(_ context.Context, tid team.ID, id string, u sandbox.NetworkUpdate) error {
	teamID := tid.String()
	f.called("UpdateNetwork")
	if f.update != nil {
		return f.update(teamID, id, u)
	}
	return nil
}

func (f *fakeSandboxes) NetworkLogs(context.Context, team.ID, string, time.Time, int) ([]egress.Entry, error) {
	f.called("NetworkLogs")
	return f.network, nil
}

func (f *fakeSandboxes) List(_ context.Context, _ team.ID, _ store.SandboxFilter) ([]store.Sandbox, error) {
	f.called("List")
	return nil, nil
}

func (f *fakeSandboxes) Kill(context.Context, team.ID, string) error {
	f.called("Kill")
	return nil
}

func (f *fakeSandboxes) SetTimeout(context.Context, team.ID, string, time.Duration) error {
	f.called("SetTimeout")
	return nil
}

func (f *fakeSandboxes) Refresh(context.Context, team.ID, string, time.Duration) error {
	f.called("Refresh")
	return nil
}

func (f *fakeSandboxes) Connect(_ context.Context, tid team.ID, id string, timeout time.Duration, memory bool) (store.Sandbox, bool, error) {
	teamID := tid.String()
	f.called("Connect")
	f.mu.Lock()
	f.last = []any{teamID, id, timeout, memory}
	f.mu.Unlock()
	if f.connect != nil {
		return f.connect(teamID, id)
	}
	return store.Sandbox{ID: "sbx1"}, false, nil
}

func (f *fakeSandboxes) Pause(_ context.Context, tid team.ID, id string, memory bool) (bool, error) {
	teamID := tid.String()
	f.called("Pause")
	if f.pause != nil {
		return f.pause(teamID, id, memory)
	}
	return true, nil
}

func (f *fakeSandboxes) ResumeSandbox(_ context.Context, tid team.ID, id string, opts sandbox.ResumeOptions) (store.Sandbox, error) {
	teamID := tid.String()
	f.called("ResumeSandbox")
	if f.resume != nil {
		return f.resume(teamID, id, opts)
	}
	return store.Sandbox{ID: id, TeamID: teamID}, nil
}

func (f *fakeSandboxes) Fork(_ context.Context, tid team.ID, id string, timeout time.Duration, count int) ([]sandbox.ForkResult, error) {
	teamID := tid.String()
	f.called("Fork")
	if f.fork != nil {
		return f.fork(teamID, id, timeout, count)
	}
	out := make([]sandbox.ForkResult, count)
	for i := range out {
		out[i].Sandbox = store.Sandbox{ID: fmt.Sprintf("child%d", i), TeamID: teamID}
	}
	return out, nil
}

func (f *fakeSandboxes) Metrics(context.Context, team.ID, string, time.Time, time.Time) ([]sandbox.Metric, error) {
	f.called("Metrics")
	return f.metrics, nil
}

func (f *fakeSandboxes) Logs(context.Context, team.ID, string, time.Time, int) ([]sandbox.LogEntry, error) {
	f.called("Logs")
	return f.logs, nil
}

// fakeTemplates records calls; err, if set, is what every call returns.
type fakeTemplates struct {
	fakeSandboxes // for its call log
	err           error
	uploaded      int64
	// info, when set, is the template List, Get and the builds answer.
	info *template.TemplateInfo
}

func (f *fakeTemplates) infoOr() template.TemplateInfo {
	if f.info != nil {
		return *f.info
	}
	return template.TemplateInfo{}
}

func (f *fakeTemplates) Create(_ context.Context, req template.CreateRequest) (template.Created, error) {
	f.called("Create")
	return template.Created{Template: store.Template{ID: "tpl1"}, BuildID: "b1", Tags: []string{"default"}}, f.err
}

func (f *fakeTemplates) FileStatus(context.Context, string, string, string, string) (bool, string, error) {
	f.called("FileStatus")
	return false, "http://x/upload", f.err
}

func (f *fakeTemplates) Upload(_ context.Context, templateID, hash, expires, signature string, body io.Reader) error {
	f.called("Upload")
	if signature != "good" {
		return template.ErrForbidden
	}
	n, err := io.Copy(io.Discard, body)
	f.mu.Lock()
	f.uploaded = n
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.err
}

func (f *fakeTemplates) StartBuild(context.Context, string, string, string, buildspec.Spec) error {
	f.called("StartBuild")
	return f.err
}

func (f *fakeTemplates) Status(context.Context, string, string, string, int, int, string) (template.Status, error) {
	f.called("Status")
	return template.Status{}, f.err
}

func (f *fakeTemplates) Rebuild(context.Context, string, string, template.RebuildRequest) (template.TemplateInfo, error) {
	f.called("Rebuild")
	return f.infoOr(), f.err
}

func (f *fakeTemplates) List(context.Context, string) ([]template.TemplateInfo, error) {
	f.called("List")
	if f.info != nil {
		return []template.TemplateInfo{*f.info}, f.err
	}
	return nil, f.err
}

func (f *fakeTemplates) Get(context.Context, string, string) (template.TemplateInfo, error) {
	f.called("Get")
	return f.infoOr(), f.err
}

func (f *fakeTemplates) Delete(context.Context, string, string) error {
	f.called("Delete")
	return f.err
}

func (f *fakeTemplates) Alias(context.Context, string, string) (store.Template, error) {
	f.called("Alias")
	return store.Template{}, f.err
}

func (f *fakeTemplates) AssignTags(context.Context, string, string, []string) (string, []string, error) {
	f.called("AssignTags")
	return "b1", []string{"v1"}, f.err
}

func (f *fakeTemplates) RemoveTags(context.Context, string, string, []string) error {
	f.called("RemoveTags")
	return f.err
}

func (f *fakeTemplates) Tags(context.Context, string, string) ([]store.Tag, error) {
	f.called("Tags")
	return nil, f.err
}

func (f *fakeTemplates) CreateSnapshot(_ context.Context, teamID, _, sandboxID, name string) (template.SnapshotRef, error) {
	f.called("CreateSnapshot")
	f.mu.Lock()
	f.last = []any{teamID, sandboxID, name}
	f.mu.Unlock()
	if name == "" {
		return template.SnapshotRef{SnapshotID: "tplsnap:default", Names: []string{}}, f.err
	}
	return template.SnapshotRef{SnapshotID: name + ":default", Names: []string{name}}, f.err
}

func (f *fakeTemplates) ListSnapshots(_ context.Context, teamID, sandboxID, name string, limit int, after *store.Cursor) ([]template.SnapshotRef, error) {
	f.called("ListSnapshots")
	f.mu.Lock()
	f.last = []any{teamID, sandboxID, name, limit, after}
	f.mu.Unlock()
	var out []template.SnapshotRef
	for i := range min(limit, 3) {
		t := store.Template{ID: fmt.Sprintf("snap%d", i), CreatedAt: time.Unix(int64(1000-i), 0)}
		out = append(out, template.SnapshotRef{SnapshotID: t.ID + ":default", Names: []string{}, Template: t})
	}
	return out, f.err
}

// harness is an API with fakes behind it and a log to read.
type harness struct {
	t         testing.TB
	h         http.Handler
	sandboxes *fakeSandboxes
	templates *fakeTemplates
	log       *testenv.Buffer
}

// newHarness builds the API from cfg, filling in the fakes and, unless
// cfg has one, a text logger into hs.log.
func newHarness(t testing.TB, cfg Config) *harness {
	hs := &harness{t: t, sandboxes: &fakeSandboxes{}, templates: &fakeTemplates{}, log: &testenv.Buffer{}}
	if cfg.Store == nil {
		cfg.Store = fakeStore{}
	}
	if cfg.Sandboxes == nil {
		cfg.Sandboxes = hs.sandboxes
	}
	if cfg.Templates == nil {
		cfg.Templates = hs.templates
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(hs.log, nil))
	}
	hs.h = New(cfg)
	return hs
}

// do sends a request with the team's key ("" for none) from remote.
func (hs *harness) do(method, path, key, body string, hdr ...string) *httptest.ResponseRecorder {
	return hs.doFrom("192.0.2.1:1234", method, path, key, body, hdr...)
}

func (hs *harness) doFrom(remote, method, path, key, body string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = remote
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	hs.h.ServeHTTP(w, req)
	return w
}

// errorBody decodes an E2B error body, failing on any other shape.
func errorBody(t *testing.T, w *httptest.ResponseRecorder) (code int, message string) {
	t.Helper()
	var e struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code == nil || e.Message == nil {
		t.Fatalf("not an E2B error body (%d): %q", w.Code, w.Body.String())
	}
	if *e.Code != w.Code {
		t.Errorf("body code %d, status %d", *e.Code, w.Code)
	}
	return *e.Code, *e.Message
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func (f *fakeTemplates) CreateFromDockerfile(context.Context, string, template.RebuildRequest) (template.TemplateInfo, error) {
	f.called("CreateFromDockerfile")
	return f.infoOr(), f.err
}

func (f *fakeTemplates) SetPublic(_ context.Context, teamID, ref string, public bool) (store.Template, error) {
	f.called("SetPublic")
	f.mu.Lock()
	f.last = []any{teamID, ref, public}
	f.mu.Unlock()
	return store.Template{ID: "tpl1", TeamID: teamID, Names: []string{"app"}, Public: public}, f.err
}
