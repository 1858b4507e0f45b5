package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
)

// dashTemplates holds team t1's templates app (two builds, the newer
// failed; tags v1 on the ready build, wip on the failed one) and api (one
// ready build), and team t2's public template other.
type dashTemplates struct{ *fakeTemplates }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func (dashTemplates) all() []template.TemplateInfo {
	return []template.TemplateInfo{
		{Template: store.Template{ID: "tplapp", TeamID: "t1", Names: []string{"acme/app"}, CPUCount: 2, MemoryMB: 1024, CreatedAt: t0, UpdatedAt: t0.Add(3 * time.Hour), BuildCount: 2},
			Builds: []store.Build{
				{ID: "b-app-1", TemplateID: "tplapp", Status: store.BuildReady, CPUCount: 2, MemoryMB: 512, DiskSizeMB: 900, EnvdVersion: "0.5.1", CreatedAt: t0, FinishedAt: t0.Add(time.Minute)},
				{ID: "b-app-2", TemplateID: "tplapp", Status: store.BuildError, ReasonMessage: "step 1 failed", CPUCount: 2, MemoryMB: 1024, CreatedAt: t0.Add(2 * time.Hour), FinishedAt: t0.Add(2*time.Hour + time.Minute)},
			}},
		{Template: store.Template{ID: "tplapi", TeamID: "t1", Names: []string{"api"}, Public: true, CreatedAt: t0.Add(time.Hour), UpdatedAt: t0.Add(time.Hour), BuildCount: 1},
			Builds: []store.Build{{ID: "b-api-1", TemplateID: "tplapi", Status: store.BuildBuilding, CreatedAt: t0.Add(time.Hour)}}},
		{Template: store.Template{ID: "tplother", TeamID: "t2", Names: []string{"other"}, Public: true, CreatedAt: t0},
			Builds: []store.Build{{ID: "b-other", TemplateID: "tplother", Status: store.BuildReady, CreatedAt: t0}}},
	}
}

func (f dashTemplates) List(_ context.Context, team string) ([]template.TemplateInfo, error) {
	var out []template.TemplateInfo
	for _, t := range f.all() {
		if t.TeamID == team {
			out = append(out, t)
		}
	}
	return out, nil
}

// Get finds a template by ID or name among the team's and the public
// ones, as the builder's lookup does.
func (f dashTemplates) Get(_ context.Context, team, ref string) (template.TemplateInfo, error) {
	for _, t := range f.all() {
		if (t.TeamID == team || t.Public) && (t.ID == ref || strings.Contains(","+strings.Join(t.Names, ",")+",", ","+ref+",")) {
			return t, nil
		}
	}
	return template.TemplateInfo{}, template.ErrNotFound
}

func (f dashTemplates) Tags(_ context.Context, team, ref string) ([]store.Tag, error) {
	switch ref {
	case "tplapp":
		return []store.Tag{
			{TemplateID: "tplapp", Tag: "v1", BuildID: "b-app-1", CreatedAt: t0.Add(time.Minute)},
			{TemplateID: "tplapp", Tag: "default", BuildID: "b-app-1", CreatedAt: t0.Add(2 * time.Minute)},
			{TemplateID: "tplapp", Tag: "wip", BuildID: "b-app-2", CreatedAt: t0.Add(2 * time.Hour)},
		}, nil
	case "tplother":
		return []store.Tag{{TemplateID: "tplother", Tag: "default", BuildID: "b-other", CreatedAt: t0}}, nil
	}
	return nil, nil
}

func dashGet(t *testing.T, hs *harness, key, path string, into any) int {
	t.Helper()
	w := hs.do("GET", DashboardAPIPrefix+path, key, "")
	if w.Code != http.StatusOK {
		errorBody(t, w)
		return w.Code
	}
	if err := json.Unmarshal(w.Body.Bytes(), into); err != nil {
		t.Fatalf("%s: %v: %s", path, err, w.Body)
	}
	return w.Code
}

func TestDashboardAPIHealthIsOpenTheRestNeedsAKey(t *testing.T) {
	hs := newHarness(t, Config{Templates: dashTemplates{&fakeTemplates{}}})
	if w := hs.do("GET", DashboardAPIPrefix+"/health", "", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"message"`) {
		t.Errorf("health: %d %s", w.Code, w.Body)
	}
	for _, p := range []string{"/templates", "/builds", "/templates/tplapp", "/builds/statuses?build_ids=x"} {
		if w := hs.do("GET", DashboardAPIPrefix+p, "", ""); w.Code != http.StatusUnauthorized {
			t.Errorf("%s without a key: %d", p, w.Code)
		}
	}
	if w := hs.do("GET", DashboardAPIPrefix+"/teams", keyTeam1, ""); w.Code != http.StatusNotFound {
		t.Errorf("an endpoint not served: %d", w.Code)
	} else {
		errorBody(t, w)
	}
	if w := hs.do("DELETE", DashboardAPIPrefix+"/templates/tplapp", keyTeam1, ""); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %d", w.Code)
	}
	// The platform API's GET /templates is untouched: a list, not a page.
	if w := hs.do("GET", "/templates", keyTeam1, ""); w.Code != 200 || !strings.HasPrefix(w.Body.String(), "[") {
		t.Errorf("platform /templates: %d %s", w.Code, w.Body)
	}
}

func TestDashboardAPITemplatesPagedSortedFilteredByTeam(t *testing.T) {
	hs := newHarness(t, Config{Templates: dashTemplates{&fakeTemplates{}}})
	type page struct {
		Data []struct {
			TemplateID, BuildID, EnvdVersion string
			Names                            []string
			Public, IsDefault                bool
			CreatedBy                        *struct{}
		}
		NextCursor *string
	}
	ids := func(p page) string {
		var s []string
		for _, d := range p.Data {
			s = append(s, d.TemplateID)
		}
		return strings.Join(s, ",")
	}
	var p page
	dashGet(t, hs, keyTeam1, "/templates", &p)
	if ids(p) != "tplapi,tplapp" || p.NextCursor != nil {
		t.Errorf("default (newest first): %s next %v", ids(p), p.NextCursor)
	}
	// The ready build, not the newer failed one, and its envd.
	if d := p.Data[1]; d.BuildID != "b-app-1" || d.EnvdVersion != "0.5.1" || d.IsDefault || d.CreatedBy != nil {
		t.Errorf("app: %+v", d)
	}
	dashGet(t, hs, keyTeam1, "/templates?sort=created_at_asc&limit=1", &p)
	if ids(p) != "tplapp" || p.NextCursor == nil {
		t.Fatalf("first page: %s next %v", ids(p), p.NextCursor)
	}
	dashGet(t, hs, keyTeam1, "/templates?sort=created_at_asc&limit=1&cursor="+url.QueryEscape(*p.NextCursor), &p)
	if ids(p) != "tplapi" || p.NextCursor != nil {
		t.Errorf("second page: %s next %v", ids(p), p.NextCursor)
	}
	dashGet(t, hs, keyTeam1, "/templates?sort=updated_at_desc", &p)
	if ids(p) != "tplapp,tplapi" {
		t.Errorf("by update: %s", ids(p))
	}
	dashGet(t, hs, keyTeam1, "/templates?public=true", &p)
	if ids(p) != "tplapi" {
		t.Errorf("public: %s", ids(p))
	}
	dashGet(t, hs, keyTeam1, "/templates?search=ACME", &p)
	if ids(p) != "tplapp" {
		t.Errorf("search: %s", ids(p))
	}
	dashGet(t, hs, keyTeam2, "/templates", &p)
	if ids(p) != "tplother" {
		t.Errorf("team 2: %s", ids(p))
	}
	for _, q := range []string{"?limit=0", "?limit=101", "?sort=name", "?public=maybe", "?cursor=x",
		"?sort=created_at_asc&cursor=" + url.QueryEscape("created_at_desc|2026-01-02T03:04:05Z|tplapp")} {
		if w := hs.do("GET", DashboardAPIPrefix+"/templates"+q, keyTeam1, ""); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d", q, w.Code)
		} else {
			errorBody(t, w)
		}
	}
}

func TestDashboardAPITemplateDetailOnlyTheTeams(t *testing.T) {
	hs := newHarness(t, Config{Templates: dashTemplates{&fakeTemplates{}}})
	var d struct {
		TemplateID, BuildID string
		CPUCount, MemoryMB  *int
		EnvdVersion         *string
	}
	dashGet(t, hs, keyTeam1, "/templates/tplapp", &d)
	if d.BuildID != "b-app-1" || d.CPUCount == nil || *d.CPUCount != 2 || *d.MemoryMB != 512 || *d.EnvdVersion != "0.5.1" {
		t.Errorf("app: %+v", d)
	}
	d.CPUCount, d.EnvdVersion = nil, nil
	dashGet(t, hs, keyTeam1, "/templates/api", &d) // by name
	if d.TemplateID != "tplapi" || d.BuildID != zeroUUID || d.CPUCount != nil || d.EnvdVersion != nil {
		t.Errorf("api (no ready build): %+v", d)
	}
	// Another team's template, public or not, is not found.
	for _, c := range []struct{ key, ref string }{{keyTeam1, "tplother"}, {keyTeam2, "tplapi"}, {keyTeam2, "tplapp"}} {
		if w := hs.do("GET", DashboardAPIPrefix+"/templates/"+c.ref, c.key, ""); w.Code != http.StatusNotFound {
			t.Errorf("%s: %d", c.ref, w.Code)
		}
		if w := hs.do("GET", DashboardAPIPrefix+"/templates/"+c.ref+"/tags/count", c.key, ""); w.Code != http.StatusNotFound {
			t.Errorf("%s tags: %d", c.ref, w.Code)
		}
	}
}

func TestDashboardAPITagsOfReadyBuildsOnly(t *testing.T) {
	hs := newHarness(t, Config{Templates: dashTemplates{&fakeTemplates{}}})
	var count struct{ Total int }
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/count", &count)
	if count.Total != 2 { // wip points at the failed build
		t.Errorf("count: %d", count.Total)
	}
	var ex struct {
		Exists        bool
		NormalizedTag string
	}
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/exists?tag=v1", &ex)
	if !ex.Exists || ex.NormalizedTag != "v1" {
		t.Errorf("v1: %+v", ex)
	}
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/exists?tag=wip", &ex)
	if ex.Exists {
		t.Errorf("wip (failed build) exists")
	}
	if w := hs.do("GET", DashboardAPIPrefix+"/templates/tplapp/tags/exists", keyTeam1, ""); w.Code != http.StatusBadRequest {
		t.Errorf("no tag: %d", w.Code)
	}
	type groups struct {
		Tags []struct {
			Tag         string
			Assignments []dashAssignment
			HasMore     bool
		}
		NextCursor *string
	}
	tags := func(g groups) string {
		var s []string
		for _, t := range g.Tags {
			s = append(s, t.Tag)
		}
		return strings.Join(s, ",")
	}
	var g groups
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/groups", &g)
	if tags(g) != "default,v1" || g.NextCursor != nil {
		t.Fatalf("latest first: %s", tags(g))
	}
	a := g.Tags[1].Assignments
	if len(a) != 1 || a[0].BuildID != "b-app-1" || !a[0].AssignedAt.Equal(t0.Add(time.Minute)) || a[0].BuildFinishedAt == nil || len(a[0].AssignmentID) != 36 {
		t.Errorf("v1's assignment: %+v", a)
	}
	first := a[0].AssignmentID
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/groups?sort=name_asc&tagsLimit=1", &g)
	if tags(g) != "default" || g.NextCursor == nil {
		t.Fatalf("by name, first page: %s %v", tags(g), g.NextCursor)
	}
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/groups?sort=name_asc&tagsLimit=1&tagsCursor="+url.QueryEscape(*g.NextCursor), &g)
	if tags(g) != "v1" || g.NextCursor != nil || g.Tags[0].Assignments[0].AssignmentID != first {
		t.Errorf("by name, second page: %s %v", tags(g), g.NextCursor)
	}
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/groups?search=v", &g)
	if tags(g) != "v1" {
		t.Errorf("search: %s", tags(g))
	}
	for _, q := range []string{"?search=V1", "?sort=new", "?tagsLimit=0", "?assignmentLimit=26", "?tagsCursor=bad"} {
		if w := hs.do("GET", DashboardAPIPrefix+"/templates/tplapp/tags/groups"+q, keyTeam1, ""); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d", q, w.Code)
		}
	}
	var as struct {
		Data       []dashAssignment
		NextCursor *string
	}
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/v1/assignments", &as)
	if len(as.Data) != 1 || as.Data[0].AssignmentID != first || as.NextCursor != nil {
		t.Errorf("v1's assignments: %+v", as)
	}
	dashGet(t, hs, keyTeam1, "/templates/tplapp/tags/wip/assignments", &as)
	if len(as.Data) != 0 {
		t.Errorf("wip's assignments: %+v", as)
	}
}

func TestDashboardAPIBuildsOfTheTeam(t *testing.T) {
	hs := newHarness(t, Config{Templates: dashTemplates{&fakeTemplates{}}})
	type page struct {
		Data []struct {
			ID, Template, TemplateID, Status string
			StatusMessage                    *string
			FinishedAt                       *time.Time
		}
		NextCursor *string
	}
	ids := func(p page) string {
		var s []string
		for _, d := range p.Data {
			s = append(s, d.ID+":"+d.Status)
		}
		return strings.Join(s, ",")
	}
	var p page
	dashGet(t, hs, keyTeam1, "/builds", &p)
	if ids(p) != "b-app-2:failed,b-api-1:building,b-app-1:success" || p.NextCursor != nil {
		t.Errorf("newest first: %s", ids(p))
	}
	if d := p.Data[0]; d.Template != "acme/app" || d.TemplateID != "tplapp" || d.StatusMessage == nil || *d.StatusMessage != "step 1 failed" {
		t.Errorf("failed build: %+v", d)
	}
	if p.Data[1].StatusMessage != nil || p.Data[1].FinishedAt != nil {
		t.Errorf("running build: %+v", p.Data[1])
	}
	dashGet(t, hs, keyTeam1, "/builds?limit=2", &p)
	if ids(p) != "b-app-2:failed,b-api-1:building" || p.NextCursor == nil {
		t.Fatalf("first page: %s", ids(p))
	}
	dashGet(t, hs, keyTeam1, "/builds?limit=2&cursor="+url.QueryEscape(*p.NextCursor), &p)
	if ids(p) != "b-app-1:success" || p.NextCursor != nil {
		t.Errorf("second page: %s", ids(p))
	}
	dashGet(t, hs, keyTeam1, "/builds?statuses=success,failed", &p)
	if ids(p) != "b-app-2:failed,b-app-1:success" {
		t.Errorf("finished: %s", ids(p))
	}
	for q, want := range map[string]string{"app": "b-app-2:failed,b-app-1:success", "acme/app": "b-app-2:failed,b-app-1:success",
		"tplapi": "b-api-1:building", "b-app-1": "b-app-1:success", "b-other": ""} {
		dashGet(t, hs, keyTeam1, "/builds?build_id_or_template="+url.QueryEscape(q), &p)
		if ids(p) != want {
			t.Errorf("%s: %s, want %s", q, ids(p), want)
		}
	}
	for _, q := range []string{"?limit=0", "?limit=101", "?statuses=ready", "?cursor=nope"} {
		if w := hs.do("GET", DashboardAPIPrefix+"/builds"+q, keyTeam1, ""); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d", q, w.Code)
		}
	}

	var st struct {
		BuildStatuses []struct{ ID, Status string }
	}
	dashGet(t, hs, keyTeam1, "/builds/statuses?build_ids=b-api-1,b-other,b-app-1,nope", &st)
	if fmt.Sprint(st.BuildStatuses) != "[{b-api-1 building} {b-app-1 success}]" {
		t.Errorf("statuses: %v", st.BuildStatuses)
	}
	if w := hs.do("GET", DashboardAPIPrefix+"/builds/statuses", keyTeam1, ""); w.Code != http.StatusBadRequest {
		t.Errorf("no IDs: %d", w.Code)
	}
	many := "x0"
	for i := 1; i <= dashBuildIDsMax; i++ {
		many += fmt.Sprintf(",x%d", i)
	}
	if w := hs.do("GET", DashboardAPIPrefix+"/builds/statuses?build_ids="+many, keyTeam1, ""); w.Code != http.StatusBadRequest {
		t.Errorf("%d IDs: %d", dashBuildIDsMax+1, w.Code)
	}

	var info struct {
		Names         []string
		Status        string
		StatusMessage *string
		FinishedAt    *time.Time
	}
	dashGet(t, hs, keyTeam1, "/builds/b-app-1", &info)
	if fmt.Sprint(info.Names) != "[acme/app]" || info.Status != "success" || info.FinishedAt == nil || info.StatusMessage != nil {
		t.Errorf("b-app-1: %+v", info)
	}
	// Another team's build is not found, from either side.
	if w := hs.do("GET", DashboardAPIPrefix+"/builds/b-other", keyTeam1, ""); w.Code != http.StatusNotFound {
		t.Errorf("team 2's build: %d", w.Code)
	}
	if w := hs.do("GET", DashboardAPIPrefix+"/builds/b-app-1", keyTeam2, ""); w.Code != http.StatusNotFound {
		t.Errorf("team 1's build for team 2: %d", w.Code)
	}
}

func TestDashboardAPIWithoutTemplatesIs501(t *testing.T) {
	hs := newHarness(t, Config{})
	hs.h = New(Config{Store: fakeStore{}, Sandboxes: hs.sandboxes})
	for _, p := range []string{"/templates", "/builds", "/templates/x/tags/count"} {
		if w := hs.do("GET", DashboardAPIPrefix+p, keyTeam1, ""); w.Code != http.StatusNotImplemented {
			t.Errorf("%s: %d", p, w.Code)
		}
	}
}
