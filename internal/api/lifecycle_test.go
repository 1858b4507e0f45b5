package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
)

func TestPauseEndpoint(t *testing.T) {
	hs := newHarness(t, Config{})
	var got []any
	hs.sandboxes.pause = func(teamID, id string, memory bool) (bool, error) {
		got = []any{teamID, id, memory}
		switch id {
		case "paused":
			return false, nil
		case "gone":
			return false, fmt.Errorf("%w: gone", sandbox.ErrNotFound)
		case "nodisk":
			return false, fmt.Errorf("%w: no disk for the checkpoint", sandbox.ErrNoCapacity)
		case "broken":
			return false, errors.New("runsc checkpoint: /var/lib/warren/sandboxes/broken: failed")
		}
		return true, nil
	}
	for _, tc := range []struct {
		id, body string
		status   int
		memory   bool
	}{
		{"sb1", "", 204, true},
		{"sb1", "{}", 204, true},
		{"sb1", `{"memory": false}`, 204, false},
		{"sb1", `{"memory": true}`, 204, true},
		{"paused", "{}", 409, true},
		{"gone", "{}", 404, true},
		{"nodisk", "{}", 503, true},
		{"broken", "{}", 500, true},
		{"sb1", `{"memory": "no"}`, 400, true},
	} {
		got = nil
		w := hs.do("POST", "/sandboxes/"+tc.id+"/pause", keyTeam1, tc.body)
		if w.Code != tc.status {
			t.Errorf("pause %s %q: %d %s, want %d", tc.id, tc.body, w.Code, w.Body, tc.status)
		}
		if w.Code != 204 {
			code, msg := errorBody(t, w)
			if code == 500 && strings.Contains(msg, "/var/lib") {
				t.Errorf("a 500 carries the error: %q", msg)
			}
		}
		if tc.status != 400 && (len(got) != 3 || got[0] != "t1" || got[2] != tc.memory) {
			t.Errorf("pause %s %q called with %v", tc.id, tc.body, got)
		}
	}
	if w := hs.do("POST", "/sandboxes/sb1/pause", "", "{}"); w.Code != 401 {
		t.Errorf("pause without a key: %d", w.Code)
	}
}

func TestResumeEndpoint(t *testing.T) {
	hs := newHarness(t, Config{})
	var got sandbox.ResumeOptions
	hs.sandboxes.resume = func(teamID, id string, opts sandbox.ResumeOptions) (store.Sandbox, error) {
		got = opts
		switch id {
		case "running":
			return store.Sandbox{}, fmt.Errorf("%w: already running", sandbox.ErrConflict)
		case "badckpt":
			return store.Sandbox{}, &sandbox.ResumeError{ID: id, Step: "restoring its memory checkpoint", Err: errors.New("runsc restore: /var/lib/warren/sandboxes/badckpt/checkpoint: corrupt")}
		}
		return store.Sandbox{ID: id, TeamID: teamID, EnvdAccessToken: "tok", EnvdVersion: "0.6"}, nil
	}
	w := hs.do("POST", "/sandboxes/sb1/resume", keyTeam1, "{}")
	if w.Code != 201 || got.Timeout != sandbox.DefaultResumeTimeout || !got.Memory || got.AutoPause != nil {
		t.Errorf("resume {}: %d %s, opts %+v", w.Code, w.Body, got)
	}
	var sb struct{ SandboxID, EnvdAccessToken string }
	if json.Unmarshal(w.Body.Bytes(), &sb); sb.SandboxID != "sb1" || sb.EnvdAccessToken != "tok" {
		t.Errorf("resume body: %s", w.Body)
	}
	w = hs.do("POST", "/sandboxes/sb1/resume", keyTeam1, `{"timeout": 120, "autoPause": true, "memory": false}`)
	if w.Code != 201 || got.Timeout != 2*time.Minute || got.Memory || got.AutoPause == nil || !*got.AutoPause {
		t.Errorf("resume with options: %d, opts %+v", w.Code, got)
	}
	if w := hs.do("POST", "/sandboxes/sb1/resume", keyTeam1, `{"timeout": -1}`); w.Code != 400 {
		t.Errorf("a negative timeout: %d", w.Code)
	}
	if w := hs.do("POST", "/sandboxes/running/resume", keyTeam1, `{}`); w.Code != 409 {
		t.Errorf("resume of a running sandbox: %d", w.Code)
	}
	// A failed restore is a 500 that says what failed and that the
	// sandbox is still paused; the detail stays in the log.
	w = hs.do("POST", "/sandboxes/badckpt/resume", keyTeam1, `{}`)
	code, msg := errorBody(t, w)
	rid := w.Header().Get(RequestIDHeader)
	if code != 500 || !strings.Contains(msg, "restoring its memory checkpoint failed") || !strings.Contains(msg, "still paused") ||
		!strings.Contains(msg, rid) || strings.Contains(msg, "/var/lib") {
		t.Errorf("failed resume: %d %q", code, msg)
	}
	if !strings.Contains(hs.log.String(), "corrupt") || !strings.Contains(hs.log.String(), rid) {
		t.Errorf("the log lacks the detail: %s", hs.log)
	}
	// connect's memory false reaches the manager.
	if w := hs.do("POST", "/v2/sandboxes/sb1/connect", keyTeam1, `{"memory": false}`); w.Code != 200 || hs.sandboxes.last[3] != false {
		t.Errorf("connect with memory false: %d %v", w.Code, hs.sandboxes.last)
	}
	if w := hs.do("POST", "/v2/sandboxes/sb1/connect", keyTeam1, `{}`); w.Code != 200 || hs.sandboxes.last[3] != true {
		t.Errorf("connect: %d %v", w.Code, hs.sandboxes.last)
	}
}

func TestForkEndpoint(t *testing.T) {
	hs := newHarness(t, Config{})
	var gotTimeout time.Duration
	var gotCount int
	hs.sandboxes.fork = func(teamID, id string, timeout time.Duration, count int) ([]sandbox.ForkResult, error) {
		gotTimeout, gotCount = timeout, count
		if id == "gone" {
			return nil, fmt.Errorf("%w: %s", sandbox.ErrNotFound, id)
		}
		if id == "paused" {
			return nil, fmt.Errorf("%w: paused; resume it first", sandbox.ErrConflict)
		}
		return []sandbox.ForkResult{
			{Sandbox: store.Sandbox{ID: "c1", TeamID: teamID, EnvdAccessToken: "t1"}},
			{Err: fmt.Errorf("%w: node full", sandbox.ErrNoCapacity)},
			{Err: errors.New("runsc restore at /var/lib/warren: boom")},
		}[:count], nil
	}
	w := hs.do("POST", "/sandboxes/sb1/fork", keyTeam1, `{"count": 3, "timeout": 60}`)
	if w.Code != 201 || gotCount != 3 || gotTimeout != time.Minute {
		t.Fatalf("fork: %d %s (count %d timeout %v)", w.Code, w.Body, gotCount, gotTimeout)
	}
	var out []struct {
		Sandbox *struct{ SandboxID string }
		Error   *struct {
			Code    int
			Message string
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || len(out) != 3 {
		t.Fatalf("fork body: %s", w.Body)
	}
	if out[0].Sandbox == nil || out[0].Sandbox.SandboxID != "c1" || out[0].Error != nil {
		t.Errorf("first result: %s", w.Body)
	}
	if out[1].Error == nil || out[1].Error.Code != 503 || out[1].Sandbox != nil {
		t.Errorf("second result: %s", w.Body)
	}
	if out[2].Error == nil || out[2].Error.Code != 500 || strings.Contains(out[2].Error.Message, "/var/lib") {
		t.Errorf("third result: %s", w.Body)
	}
	w = hs.do("POST", "/sandboxes/sb1/fork", keyTeam1, ``)
	if w.Code != 201 || gotCount != 1 || gotTimeout != sandbox.DefaultResumeTimeout {
		t.Errorf("fork with defaults: %d (count %d timeout %v)", w.Code, gotCount, gotTimeout)
	}
	for _, body := range []string{`{"count": 0}`, `{"count": 101}`, `{"count": -1}`, `{"timeout": 0}`, `{"timeout": 90000}`, `{"count": "3"}`} {
		if w := hs.do("POST", "/sandboxes/sb1/fork", keyTeam1, body); w.Code != 400 {
			t.Errorf("fork %s: %d", body, w.Code)
		}
	}
	if w := hs.do("POST", "/sandboxes/gone/fork", keyTeam1, `{}`); w.Code != 404 {
		t.Errorf("fork of an unknown sandbox: %d (the SDK reads the status)", w.Code)
	}
	if w := hs.do("POST", "/sandboxes/paused/fork", keyTeam1, `{}`); w.Code != 409 {
		t.Errorf("fork of a paused sandbox: %d", w.Code)
	}
}

func TestSnapshotEndpoints(t *testing.T) {
	hs := newHarness(t, Config{})
	w := hs.do("POST", "/sandboxes/sb1/snapshots", keyTeam1, `{}`)
	if w.Code != 201 || !strings.Contains(w.Body.String(), `"snapshotID":"tplsnap:default"`) || !strings.Contains(w.Body.String(), `"names":[]`) {
		t.Errorf("snapshot {}: %d %s", w.Code, w.Body)
	}
	w = hs.do("POST", "/sandboxes/sb1/snapshots", keyTeam1, `{"name": "mine"}`)
	if w.Code != 201 || hs.templates.last[0] != "t1" || hs.templates.last[1] != "sb1" || hs.templates.last[2] != "mine" {
		t.Errorf("named snapshot: %d %s %v", w.Code, w.Body, hs.templates.last)
	}
	for err, status := range map[error]int{
		fmt.Errorf("%w: x", sandbox.ErrNotFound):   404,
		fmt.Errorf("%w: x", sandbox.ErrConflict):   409,
		fmt.Errorf("%w: x", template.ErrConflict):  409,
		fmt.Errorf("%w: x", template.ErrInvalid):   400,
		fmt.Errorf("%w: x", sandbox.ErrNoCapacity): 503,
		errors.New("checkpoint of /var/lib/x"):     500,
	} {
		hs.templates.err = err
		w := hs.do("POST", "/sandboxes/sb1/snapshots", keyTeam1, `{"name": "mine"}`)
		if code, msg := errorBody(t, w); code != status || strings.Contains(msg, "/var/lib") {
			t.Errorf("snapshot failing with %v: %d %q, want %d", err, code, msg, status)
		}
	}
	hs.templates.err = nil

	// Listing: pages of limit, X-Next-Token with the last one's position.
	w = hs.do("GET", "/snapshots?limit=2&sandboxID=sb1&name=mine", keyTeam1, "")
	next := w.Header().Get("X-Next-Token")
	if w.Code != 200 || next == "" || !strings.Contains(w.Body.String(), "snap1:default") || strings.Contains(w.Body.String(), "snap2") {
		t.Fatalf("first page: %d %s (next %q)", w.Code, w.Body, next)
	}
	if l := hs.templates.last; l[0] != "t1" || l[1] != "sb1" || l[2] != "mine" || l[3] != 3 || l[4] != (*store.Cursor)(nil) {
		t.Errorf("listed with %v", l)
	}
	w = hs.do("GET", "/snapshots?limit=2&nextToken="+next, keyTeam1, "")
	if c, _ := hs.templates.last[4].(*store.Cursor); w.Code != 200 || c == nil || c.ID != "snap1" || !c.StartedAt.Equal(time.Unix(999, 0)) {
		t.Errorf("second page: %d, cursor %v", w.Code, hs.templates.last[4])
	}
	if w := hs.do("GET", "/snapshots", keyTeam1, ""); w.Code != 200 || w.Header().Get("X-Next-Token") != "" {
		t.Errorf("a last page: %d, next %q", w.Code, w.Header().Get("X-Next-Token"))
	}
	for _, q := range []string{"limit=0", "limit=101", "nextToken=not*a*token", "nextToken=" + makeToken(store.Cursor{StartedAt: time.Unix(1, 0), ID: "x"}, false), "name=" + strings.Repeat("a", 300)} {
		if w := hs.do("GET", "/snapshots?"+q, keyTeam1, ""); w.Code != http.StatusBadRequest {
			t.Errorf("GET /snapshots?%s: %d", q, w.Code)
		}
	}
}
