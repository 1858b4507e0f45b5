package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/template"
)

// teamMetrics answers Metrics for team t1's sandboxes a and b only.
type teamMetrics struct{ *fakeSandboxes }

func (f teamMetrics) Metrics(_ context.Context, tid team.ID, id string, _, _ time.Time) ([]sandbox.Metric, error) {
	team := tid.String()
	if team != "t1" || (id != "a" && id != "b") {
		return nil, sandbox.ErrNotFound
	}
	t0 := time.Unix(1000, 0)
	return []sandbox.Metric{{Time: t0, CPUUsedPct: 1}, {Time: t0.Add(5 * time.Second), CPUUsedPct: 2, MemUsed: int64(len(id))}}, nil
}

func TestSandboxesMetricsLatestOfTheTeamsOnly(t *testing.T) {
	hs := newHarness(t, Config{Sandboxes: teamMetrics{&fakeSandboxes{}}})
	w := hs.do("GET", "/sandboxes/metrics?sandbox_ids=a,b,c,a", keyTeam1, "")
	var got struct {
		Sandboxes map[string]struct {
			CPUUsedPct    float64 `json:"cpuUsedPct"`
			TimestampUnix int64   `json:"timestampUnix"`
		} `json:"sandboxes"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if len(got.Sandboxes) != 2 || got.Sandboxes["a"].CPUUsedPct != 2 || got.Sandboxes["b"].TimestampUnix != 1005 {
		t.Errorf("got %+v", got.Sandboxes)
	}
	// Team 2 names team 1's sandboxes: nothing.
	w = hs.do("GET", "/sandboxes/metrics?sandbox_ids=a,b", keyTeam2, "")
	if w.Code != 200 || w.Body.String() != "{\"sandboxes\":{}}\n" {
		t.Errorf("team 2: %d %s", w.Code, w.Body)
	}
	if w := hs.do("GET", "/sandboxes/metrics", keyTeam1, ""); w.Code != http.StatusBadRequest {
		t.Errorf("no IDs: %d", w.Code)
	}
	many := "x0"
	for i := 1; i <= maxMetricsIDs; i++ {
		many += fmt.Sprintf(",x%d", i)
	}
	if w := hs.do("GET", "/sandboxes/metrics?sandbox_ids="+many, keyTeam1, ""); w.Code != http.StatusBadRequest {
		t.Errorf("%d IDs: %d", maxMetricsIDs+1, w.Code)
	}
	if w := hs.do("GET", "/sandboxes/metrics?sandbox_ids=a", "", ""); w.Code != http.StatusUnauthorized {
		t.Errorf("no key: %d", w.Code)
	}
}

// pagedLogs holds 250 entries of build b1 of team t1, one a second,
// every tenth a warning, and pages them as template.Builder.Status does.
type pagedLogs struct{ *fakeTemplates }

func (f pagedLogs) Status(_ context.Context, team, tpl, build string, offset, limit int, level string) (template.Status, error) {
	if team != "t1" || tpl != "tpl1" || build != "b1" {
		return template.Status{}, template.ErrNotFound
	}
	var all []store.BuildLogEntry
	for i := range 250 {
		lvl := "info"
		if i%10 == 0 {
			lvl = "warn"
		}
		if level == "warn" && lvl != "warn" {
			continue
		}
		all = append(all, store.BuildLogEntry{Time: time.UnixMilli(int64(1_000_000 + i*1000)), Level: lvl, Message: fmt.Sprint(i)})
	}
	end := min(offset+limit, len(all))
	if offset > len(all) {
		offset = end
	}
	return template.Status{Build: store.Build{ID: build, TemplateID: tpl}, Logs: all[offset:end]}, nil
}

func TestBuildLogsCursorDirectionLevel(t *testing.T) {
	hs := newHarness(t, Config{Templates: pagedLogs{&fakeTemplates{}}})
	get := func(query string) []string {
		t.Helper()
		w := hs.do("GET", "/templates/tpl1/builds/b1/logs"+query, keyTeam1, "")
		var body struct {
			Logs []struct{ Message, Level string } `json:"logs"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != 200 {
			t.Fatalf("%s: %d %s", query, w.Code, w.Body)
		}
		var out []string
		for _, l := range body.Logs {
			out = append(out, l.Message)
		}
		return out
	}
	if got := get(""); len(got) != 100 || got[0] != "0" || got[99] != "99" {
		t.Errorf("default: %d entries %v…", len(got), got[:3])
	}
	if got := get("?cursor=1200000&limit=3"); fmt.Sprint(got) != "[200 201 202]" {
		t.Errorf("forward from 200: %v", got)
	}
	if got := get("?cursor=1200000&limit=3&direction=backward"); fmt.Sprint(got) != "[200 199 198]" {
		t.Errorf("backward from 200: %v", got)
	}
	if got := get("?direction=backward&limit=2"); fmt.Sprint(got) != "[249 248]" {
		t.Errorf("backward from now: %v", got)
	}
	if got := get("?level=warn&cursor=1100000&limit=3"); fmt.Sprint(got) != "[100 110 120]" {
		t.Errorf("warn from 100: %v", got)
	}
	for _, q := range []string{"?limit=101", "?limit=-1", "?direction=up", "?level=loud", "?cursor=x"} {
		if w := hs.do("GET", "/templates/tpl1/builds/b1/logs"+q, keyTeam1, ""); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d", q, w.Code)
		}
	}
	// Another team's build is not found.
	if w := hs.do("GET", "/templates/tpl1/builds/b1/logs", keyTeam2, ""); w.Code != http.StatusNotFound {
		t.Errorf("team 2: %d %s", w.Code, w.Body)
	}
}
