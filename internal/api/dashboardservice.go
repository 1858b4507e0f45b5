package api

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
)

// E2B's dashboard talks to two services: the platform API (served at the
// root) and E2B's dashboard-api, a separate service in E2B's
// infrastructure whose paths clash with the platform API's (GET
// /templates answers a list there and a page here). Warren serves the
// dashboard-api's team reads under DashboardAPIPrefix, with the same
// credentials and team scoping as the platform API, so that E2B's
// dashboard runs with NEXT_PUBLIC_DASHBOARD_API_URL=<api>/dashboard-api.
// Its user, team and admin endpoints (Supabase accounts in E2B) are not
// served: an API key names one team, and the dashboard's API-key mode
// calls none of them.
//
// Warren keeps a tag's current build, not the history of its
// assignments: each tag has one assignment, at the time it was set.
const DashboardAPIPrefix = "/dashboard-api"

// Page bounds, E2B's.
const (
	dashTemplatesPage    = 50
	dashTemplatesMax     = 100
	dashBuildsPage       = 50
	dashBuildsMax        = 100
	dashBuildIDsMax      = 100
	dashTagGroupsPage    = 25
	dashTagGroupsMax     = 100
	dashAssignmentsLimit = 6
	dashAssignmentsMax   = 25
	dashTagAssignPage    = 50
	dashTagAssignMax     = 100
	dashTagSearchMax     = 64
)

// zeroUUID is what E2B names "no build".
const zeroUUID = "00000000-0000-0000-0000-000000000000"

var tagSearchPattern = regexp.MustCompile(`^[a-z0-9._-]*$`)

// dashboardService serves path (below DashboardAPIPrefix); every route is a GET.
func (s *Server) dashboardService(w http.ResponseWriter, r *http.Request, path string) {
	if path == "/health" {
		writeJSON(w, http.StatusOK, map[string]string{"message": "Health check successful"})
		return
	}
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for _, p := range parts {
		if p == "" {
			s.dashNotFound(w, r)
			return
		}
	}
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s is not served: the dashboard API is read only", r.Method, r.URL.EscapedPath()))
		return
	}
	switch {
	case len(parts) == 1 && parts[0] == "templates":
		s.dashTemplates(w, r)
	case len(parts) == 2 && parts[0] == "templates" && parts[1] != "defaults":
		s.dashTemplate(w, r, parts[1])
	case len(parts) == 4 && parts[0] == "templates" && parts[2] == "tags" && parts[3] == "count":
		s.dashTagCount(w, r, parts[1])
	case len(parts) == 4 && parts[0] == "templates" && parts[2] == "tags" && parts[3] == "exists":
		s.dashTagExists(w, r, parts[1])
	case len(parts) == 4 && parts[0] == "templates" && parts[2] == "tags" && parts[3] == "groups":
		s.dashTagGroups(w, r, parts[1])
	case len(parts) == 5 && parts[0] == "templates" && parts[2] == "tags" && parts[4] == "assignments":
		s.dashTagAssignments(w, r, parts[1], parts[3])
	case len(parts) == 1 && parts[0] == "builds":
		s.dashBuilds(w, r)
	case len(parts) == 2 && parts[0] == "builds" && parts[1] == "statuses":
		s.dashBuildStatuses(w, r)
	case len(parts) == 2 && parts[0] == "builds":
		s.dashBuild(w, r, parts[1])
	default:
		s.dashNotFound(w, r)
	}
}

func (s *Server) dashNotFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.EscapedPath()))
}

// dashStatus is a build's status as the dashboard API names it.
func dashStatus(st store.BuildStatus) string {
	switch st {
	case store.BuildReady:
		return "success"
	case store.BuildError:
		return "failed"
	default: // waiting, building
		return "building"
	}
}

func dashStatusMessage(b store.Build) *string {
	if b.Status != store.BuildError {
		return nil
	}
	m := b.ReasonMessage
	return &m
}

// intParam reads an optional integer query parameter between lo and hi.
func intParam(w http.ResponseWriter, q url.Values, name string, def, lo, hi int) (int, bool) {
	v := q.Get(name)
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be between %d and %d", name, lo, hi))
		return 0, false
	}
	return n, true
}

// listParam reads a comma-separated list parameter (E2B's form style,
// explode false; repeated parameters are accepted too).
func listParam(q url.Values, name string) []string {
	var out []string
	for _, v := range q[name] {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" && !slices.Contains(out, e) {
				out = append(out, e)
			}
		}
	}
	return out
}

// ownTemplate is the team's template ref; another team's (even a public
// one) is not found, as E2B's dashboard API answers.
func (s *Server) ownTemplate(w http.ResponseWriter, r *http.Request, ref string) (template.TemplateInfo, bool) {
	b, ok := s.templates(w)
	if !ok {
		return template.TemplateInfo{}, false
	}
	t, err := b.Get(r.Context(), teamOf(r), ref)
	if err == nil && t.TeamID != teamOf(r) {
		err = fmt.Errorf("%w: template %q not found", template.ErrNotFound, ref)
	}
	if err != nil {
		s.failTemplate(w, r, err)
		return template.TemplateInfo{}, false
	}
	return t, true
}

// dashTeamTemplate is E2B's TeamTemplate.
type dashTeamTemplate struct {
	TemplateID         string     `json:"templateID"`
	BuildID            string     `json:"buildID"`
	CPUCount           int        `json:"cpuCount"`
	MemoryMB           int        `json:"memoryMB"`
	DiskSizeMB         int        `json:"diskSizeMB"`
	Public             bool       `json:"public"`
	Aliases            []string   `json:"aliases"`
	Names              []string   `json:"names"`
	CreatedAt          time.Time  `json:"createdAt"`
	UpdatedAt          time.Time  `json:"updatedAt"`
	CreatedBy          *struct{}  `json:"createdBy"`
	LastSpawnedAt      *time.Time `json:"lastSpawnedAt"`
	SpawnCount         int64      `json:"spawnCount"`
	BuildCount         int        `json:"buildCount"`
	EnvdVersion        string     `json:"envdVersion"`
	IsDefault          bool       `json:"isDefault"`
	DefaultDescription *string    `json:"defaultDescription"`
}

func teamTemplateOf(t template.TemplateInfo) dashTeamTemplate {
	out := dashTeamTemplate{
		TemplateID: t.ID, BuildID: zeroUUID, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
		Public: t.Public, Aliases: orEmptyList(t.Names), Names: orEmptyList(t.Names), CreatedAt: t.CreatedAt,
		UpdatedAt: t.UpdatedAt, LastSpawnedAt: timeOrNil(t.LastSpawnedAt), SpawnCount: t.SpawnCount,
		BuildCount: t.BuildCount, EnvdVersion: envdinfo.Version,
	}
	if b := t.LastReady(); b != nil {
		out.BuildID = b.ID
		if b.EnvdVersion != "" {
			out.EnvdVersion = b.EnvdVersion
		}
	} else if b := t.Last(); b != nil {
		out.BuildID = b.ID
	}
	return out
}

// templateSorts maps E2B's sort names to the time they sort by and
// whether newest first.
var templateSorts = map[string]struct {
	at   func(template.TemplateInfo) time.Time
	desc bool
}{
	"created_at_desc": {func(t template.TemplateInfo) time.Time { return t.CreatedAt }, true},
	"created_at_asc":  {func(t template.TemplateInfo) time.Time { return t.CreatedAt }, false},
	"updated_at_desc": {func(t template.TemplateInfo) time.Time { return t.UpdatedAt }, true},
	"updated_at_asc":  {func(t template.TemplateInfo) time.Time { return t.UpdatedAt }, false},
}

// dashTemplates is GET /templates: the team's templates, filtered by
// visibility and a case-insensitive search of names and ID, sorted by
// creation or update time, paged by a keyset cursor
// "{sort}|{time}|{templateID}".
func (s *Server) dashTemplates(w http.ResponseWriter, r *http.Request) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit, ok := intParam(w, q, "limit", dashTemplatesPage, 1, dashTemplatesMax)
	if !ok {
		return
	}
	sortName, srt, ok := sortParam(w, q, "created_at_desc", templateSorts, "created_at_asc, created_at_desc, updated_at_asc or updated_at_desc")
	if !ok {
		return
	}
	var public *bool
	if v := q.Get("public"); v != "" {
		p, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "public must be true or false")
			return
		}
		public = &p
	}
	search := strings.ToLower(strings.TrimSpace(q.Get("search")))
	after, ok := cursorParam(w, q, "cursor", sortName)
	if !ok {
		return
	}
	list, err := b.List(r.Context(), teamOf(r))
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	var picked []template.TemplateInfo
	for _, t := range list {
		if t.TeamID != teamOf(r) || public != nil && t.Public != *public || search != "" && !templateMatches(t, search) {
			continue
		}
		picked = append(picked, t)
	}
	slices.SortFunc(picked, func(a, c template.TemplateInfo) int {
		return keysetCompare(srt.at(a), a.ID, srt.at(c), c.ID, srt.desc)
	})
	out := make([]dashTeamTemplate, 0, min(limit, len(picked)))
	var next *string
	for i, t := range picked {
		if after != nil && keysetCompare(srt.at(t), t.ID, after.at, after.id, srt.desc) <= 0 {
			continue
		}
		if len(out) == limit {
			last := picked[i-1]
			c := makeKeyset(sortName, srt.at(last), last.ID)
			next = &c
			break
		}
		out = append(out, teamTemplateOf(t))
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out, "nextCursor": next})
}

func templateMatches(t template.TemplateInfo, search string) bool {
	if strings.Contains(strings.ToLower(t.ID), search) {
		return true
	}
	for _, n := range t.Names {
		if strings.Contains(strings.ToLower(n), search) {
			return true
		}
	}
	return false
}

// keyset is a cursor's position: a time and an ID (or tag) that breaks
// ties.
type keyset struct {
	at time.Time
	id string
}

func makeKeyset(sortName string, at time.Time, id string) string {
	return sortName + "|" + at.UTC().Format(time.RFC3339Nano) + "|" + id
}

// parseKeyset reads "{sort}|{RFC3339Nano}|{id}", refusing one made for
// another sort.
// sortParam reads q's "sort" (def when absent) as one of sorts; another
// is answered 400 naming the allowed ones.
func sortParam[T any](w http.ResponseWriter, q url.Values, def string, sorts map[string]T, allowed string) (string, T, bool) {
	name := q.Get("sort")
	if name == "" {
		name = def
	}
	v, known := sorts[name]
	if !known {
		writeError(w, http.StatusBadRequest, "sort must be "+allowed)
	}
	return name, v, known
}

// cursorParam reads q's param as a keyset cursor of the sort sortName:
// nil when absent; a bad one is answered 400.
func cursorParam(w http.ResponseWriter, q url.Values, param, sortName string) (*keyset, bool) {
	v := q.Get(param)
	if v == "" {
		return nil, true
	}
	k, err := parseKeyset(v, sortName)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	return &k, true
}

func parseKeyset(v, sortName string) (keyset, error) {
	parts := strings.SplitN(v, "|", 3)
	if len(parts) != 3 || parts[2] == "" {
		return keyset{}, fmt.Errorf("invalid cursor %q", v)
	}
	if parts[0] != sortName {
		return keyset{}, fmt.Errorf("cursor %q was made for sort %q, not %q", v, parts[0], sortName)
	}
	at, err := time.Parse(time.RFC3339Nano, parts[1])
	if err != nil {
		return keyset{}, fmt.Errorf("invalid cursor %q", v)
	}
	return keyset{at, parts[2]}, nil
}

// keysetCompare orders (at, id) pairs, newest first when desc.
func keysetCompare(a time.Time, aID string, b time.Time, bID string, desc bool) int {
	c := a.Compare(b)
	if c == 0 {
		c = strings.Compare(aID, bID)
	}
	if desc {
		return -c
	}
	return c
}

// dashTemplateDetail is E2B's TemplateDetail: the template with its
// latest ready build's resources (null without one).
type dashTemplateDetail struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      *int       `json:"cpuCount"`
	MemoryMB      *int       `json:"memoryMB"`
	DiskSizeMB    *int       `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int        `json:"buildCount"`
	EnvdVersion   *string    `json:"envdVersion"`
}

func (s *Server) dashTemplate(w http.ResponseWriter, r *http.Request, ref string) {
	t, ok := s.ownTemplate(w, r, ref)
	if !ok {
		return
	}
	out := dashTemplateDetail{
		TemplateID: t.ID, BuildID: zeroUUID, Public: t.Public, Aliases: orEmptyList(t.Names), Names: orEmptyList(t.Names),
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, LastSpawnedAt: timeOrNil(t.LastSpawnedAt),
		SpawnCount: t.SpawnCount, BuildCount: t.BuildCount,
	}
	if b := t.LastReady(); b != nil {
		cpu, mem, disk, envd := b.CPUCount, b.MemoryMB, b.DiskSizeMB, b.EnvdVersion
		if envd == "" {
			envd = envdinfo.Version
		}
		out.BuildID, out.CPUCount, out.MemoryMB, out.DiskSizeMB, out.EnvdVersion = b.ID, &cpu, &mem, &disk, &envd
	}
	writeJSON(w, http.StatusOK, out)
}

// dashAssignment is E2B's TemplateTagAssignment.
type dashAssignment struct {
	AssignmentID    string     `json:"assignmentId"`
	BuildID         string     `json:"buildId"`
	AssignedAt      time.Time  `json:"assignedAt"`
	BuildCreatedAt  time.Time  `json:"buildCreatedAt"`
	BuildFinishedAt *time.Time `json:"buildFinishedAt"`
}

// readyTag is a tag whose build is ready (E2B's dashboard lists only
// those), with that build.
type readyTag struct {
	store.Tag
	build store.Build
}

// readyTags are template t's tags whose build is ready.
func (s *Server) readyTags(w http.ResponseWriter, r *http.Request, t template.TemplateInfo) ([]readyTag, bool) {
	b, ok := s.templates(w)
	if !ok {
		return nil, false
	}
	tags, err := b.Tags(r.Context(), teamOf(r), t.ID)
	if err != nil {
		s.failTemplate(w, r, err)
		return nil, false
	}
	var out []readyTag
	for _, tg := range tags {
		for _, bd := range t.Builds {
			if bd.ID == tg.BuildID && bd.Status == store.BuildReady {
				out = append(out, readyTag{tg, bd})
				break
			}
		}
	}
	return out, true
}

// assignmentOf is tag's one assignment; its ID is derived from what it
// is, so that it stays the same from one read to the next.
func assignmentOf(templateID string, tg readyTag) dashAssignment {
	sum := sha256.Sum256([]byte(templateID + "\x00" + tg.Tag.Tag + "\x00" + tg.BuildID + "\x00" + tg.CreatedAt.UTC().Format(time.RFC3339Nano)))
	sum[6] = sum[6]&0x0f | 0x80 // version 8: a custom UUID
	sum[8] = sum[8]&0x3f | 0x80 // RFC 9562 variant
	id := fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
	return dashAssignment{AssignmentID: id, BuildID: tg.BuildID, AssignedAt: tg.CreatedAt, BuildCreatedAt: tg.build.CreatedAt,
		BuildFinishedAt: timeOrNil(tg.build.FinishedAt)}
}

func (s *Server) dashTagCount(w http.ResponseWriter, r *http.Request, ref string) {
	t, ok := s.ownTemplate(w, r, ref)
	if !ok {
		return
	}
	tags, ok := s.readyTags(w, r, t)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"total": len(tags)})
}

func (s *Server) dashTagExists(w http.ResponseWriter, r *http.Request, ref string) {
	tag := strings.TrimSpace(r.URL.Query().Get("tag"))
	if tag == "" {
		writeError(w, http.StatusBadRequest, "tag is required")
		return
	}
	t, ok := s.ownTemplate(w, r, ref)
	if !ok {
		return
	}
	tags, ok := s.readyTags(w, r, t)
	if !ok {
		return
	}
	exists := slices.ContainsFunc(tags, func(tg readyTag) bool { return tg.Tag.Tag == tag })
	writeJSON(w, http.StatusOK, map[string]any{"exists": exists, "normalizedTag": tag})
}

// tagSorts orders ready tags as E2B's sort names say: by assignment time
// (ties by tag) or by name.
var tagSorts = map[string]func(a, b readyTag) int{
	"latest_desc": func(a, b readyTag) int { return keysetCompare(a.CreatedAt, a.Tag.Tag, b.CreatedAt, b.Tag.Tag, true) },
	"latest_asc":  func(a, b readyTag) int { return keysetCompare(a.CreatedAt, a.Tag.Tag, b.CreatedAt, b.Tag.Tag, false) },
	"name_asc":    func(a, b readyTag) int { return strings.Compare(a.Tag.Tag, b.Tag.Tag) },
	"name_desc":   func(a, b readyTag) int { return strings.Compare(b.Tag.Tag, a.Tag.Tag) },
}

// dashTagGroups is GET /templates/{id}/tags/groups: the template's ready
// tags, each with its assignments (one: see DashboardAPIPrefix), paged
// by a cursor "{sort}|{assigned at}|{tag}".
func (s *Server) dashTagGroups(w http.ResponseWriter, r *http.Request, ref string) {
	q := r.URL.Query()
	if _, ok := intParam(w, q, "assignmentLimit", dashAssignmentsLimit, 1, dashAssignmentsMax); !ok {
		return
	}
	limit, ok := intParam(w, q, "tagsLimit", dashTagGroupsPage, 1, dashTagGroupsMax)
	if !ok {
		return
	}
	sortName, cmp, ok := sortParam(w, q, "latest_desc", tagSorts, "latest_desc, latest_asc, name_asc or name_desc")
	if !ok {
		return
	}
	search := q.Get("search")
	if len(search) > dashTagSearchMax || !tagSearchPattern.MatchString(search) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("search must be at most %d of a-z, 0-9, '.', '_' and '-'", dashTagSearchMax))
		return
	}
	after, ok := cursorParam(w, q, "tagsCursor", sortName)
	if !ok {
		return
	}
	t, ok := s.ownTemplate(w, r, ref)
	if !ok {
		return
	}
	tags, ok := s.readyTags(w, r, t)
	if !ok {
		return
	}
	tags = slices.DeleteFunc(tags, func(tg readyTag) bool { return !strings.Contains(strings.ToLower(tg.Tag.Tag), search) })
	slices.SortFunc(tags, cmp)
	type group struct {
		Tag         string           `json:"tag"`
		Assignments []dashAssignment `json:"assignments"`
		HasMore     bool             `json:"hasMore"`
	}
	out := make([]group, 0, min(limit, len(tags)))
	var next *string
	for i, tg := range tags {
		if after != nil && cmp(tg, readyTag{Tag: store.Tag{Tag: after.id, CreatedAt: after.at}}) <= 0 {
			continue
		}
		if len(out) == limit {
			last := tags[i-1]
			c := makeKeyset(sortName, last.CreatedAt, last.Tag.Tag)
			next = &c
			break
		}
		out = append(out, group{Tag: tg.Tag.Tag, Assignments: []dashAssignment{assignmentOf(t.ID, tg)}})
	}
	writeJSON(w, http.StatusOK, map[string]any{"tags": out, "nextCursor": next})
}

// dashTagAssignments is GET /templates/{id}/tags/{tag}/assignments: the
// tag's assignment, if its build is ready (one: see DashboardAPIPrefix).
func (s *Server) dashTagAssignments(w http.ResponseWriter, r *http.Request, ref, tag string) {
	if _, ok := intParam(w, r.URL.Query(), "limit", dashTagAssignPage, 1, dashTagAssignMax); !ok {
		return
	}
	t, ok := s.ownTemplate(w, r, ref)
	if !ok {
		return
	}
	tags, ok := s.readyTags(w, r, t)
	if !ok {
		return
	}
	out := []dashAssignment{}
	// A cursor points past the one assignment there is.
	if r.URL.Query().Get("cursor") == "" {
		for _, tg := range tags {
			if tg.Tag.Tag == tag {
				out = append(out, assignmentOf(t.ID, tg))
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out, "nextCursor": nil})
}

// teamBuild is a build with its template.
type teamBuild struct {
	store.Build
	template template.TemplateInfo
}

// teamBuilds are every build of the team's templates.
func (s *Server) teamBuilds(w http.ResponseWriter, r *http.Request) ([]teamBuild, bool) {
	b, ok := s.templates(w)
	if !ok {
		return nil, false
	}
	list, err := b.List(r.Context(), teamOf(r))
	if err != nil {
		s.failTemplate(w, r, err)
		return nil, false
	}
	var out []teamBuild
	for _, t := range list {
		if t.TeamID != teamOf(r) {
			continue
		}
		for _, bd := range t.Builds {
			out = append(out, teamBuild{bd, t})
		}
	}
	return out, true
}

// dashListedBuild is E2B's ListedBuild.
type dashListedBuild struct {
	ID            string     `json:"id"`
	Template      string     `json:"template"`
	TemplateID    string     `json:"templateId"`
	Status        string     `json:"status"`
	StatusMessage *string    `json:"statusMessage"`
	CreatedAt     time.Time  `json:"createdAt"`
	FinishedAt    *time.Time `json:"finishedAt"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int        `json:"memoryMB"`
	DiskSizeMB    *int       `json:"diskSizeMB"`
	EnvdVersion   *string    `json:"envdVersion"`
}

// matchesBuildRef tells whether v names the build, its template's ID, or
// one of its template's names (with or without namespace).
func matchesBuildRef(b teamBuild, v string) bool {
	if b.ID == v || b.template.ID == v {
		return true
	}
	for _, n := range b.template.Names {
		if n == v {
			return true
		}
		if _, alias, ok := strings.Cut(n, "/"); ok && alias == v {
			return true
		}
	}
	return false
}

// dashBuilds is GET /builds: the team's builds newest first, filtered by
// status and by a build ID, template ID or name, paged by a cursor
// "{created at}|{build ID}".
func (s *Server) dashBuilds(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, ok := intParam(w, q, "limit", dashBuildsPage, 1, dashBuildsMax)
	if !ok {
		return
	}
	statuses := listParam(q, "statuses")
	for _, st := range statuses {
		if st != "building" && st != "failed" && st != "success" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("status %q must be building, failed or success", st))
			return
		}
	}
	var after *keyset
	if v := q.Get("cursor"); v != "" {
		at, id, ok := strings.Cut(v, "|")
		t, err := time.Parse(time.RFC3339Nano, at)
		if !ok || err != nil || id == "" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid cursor %q", v))
			return
		}
		after = &keyset{t, id}
	}
	ref := strings.TrimSpace(q.Get("build_id_or_template"))
	all, ok := s.teamBuilds(w, r)
	if !ok {
		return
	}
	all = slices.DeleteFunc(all, func(b teamBuild) bool {
		return len(statuses) > 0 && !slices.Contains(statuses, dashStatus(b.Status)) || ref != "" && !matchesBuildRef(b, ref)
	})
	slices.SortFunc(all, func(a, b teamBuild) int { return keysetCompare(a.CreatedAt, a.ID, b.CreatedAt, b.ID, true) })
	out := make([]dashListedBuild, 0, min(limit, len(all)))
	var next *string
	for i, b := range all {
		if after != nil && keysetCompare(b.CreatedAt, b.ID, after.at, after.id, true) <= 0 {
			continue
		}
		if len(out) == limit {
			last := all[i-1]
			c := last.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + last.ID
			next = &c
			break
		}
		name := b.template.ID
		if len(b.template.Names) > 0 {
			name = b.template.Names[0]
		}
		disk, envd := b.DiskSizeMB, b.EnvdVersion
		lb := dashListedBuild{ID: b.ID, Template: name, TemplateID: b.template.ID, Status: dashStatus(b.Status),
			StatusMessage: dashStatusMessage(b.Build), CreatedAt: b.CreatedAt, FinishedAt: timeOrNil(b.FinishedAt),
			CPUCount: b.CPUCount, MemoryMB: b.MemoryMB, DiskSizeMB: &disk}
		if envd != "" {
			lb.EnvdVersion = &envd
		}
		out = append(out, lb)
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out, "nextCursor": next})
}

// dashBuildStatuses is GET /builds/statuses: the status of each named
// build of the team; others (unknown, another team's) are left out.
func (s *Server) dashBuildStatuses(w http.ResponseWriter, r *http.Request) {
	ids := listParam(r.URL.Query(), "build_ids")
	if len(ids) == 0 {
		writeError(w, http.StatusBadRequest, "build_ids is required: a comma-separated list of build IDs")
		return
	}
	if len(ids) > dashBuildIDsMax {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("build_ids names %d builds; at most %d", len(ids), dashBuildIDsMax))
		return
	}
	all, ok := s.teamBuilds(w, r)
	if !ok {
		return
	}
	type item struct {
		ID            string     `json:"id"`
		Status        string     `json:"status"`
		FinishedAt    *time.Time `json:"finishedAt"`
		StatusMessage *string    `json:"statusMessage"`
	}
	out := []item{}
	for _, id := range ids {
		for _, b := range all {
			if b.ID == id {
				out = append(out, item{b.ID, dashStatus(b.Status), timeOrNil(b.FinishedAt), dashStatusMessage(b.Build)})
				break
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"buildStatuses": out})
}

// dashBuild is GET /builds/{build_id}: one of the team's builds.
func (s *Server) dashBuild(w http.ResponseWriter, r *http.Request, id string) {
	all, ok := s.teamBuilds(w, r)
	if !ok {
		return
	}
	for _, b := range all {
		if b.ID == id {
			writeJSON(w, http.StatusOK, map[string]any{
				"names": orEmptyList(b.template.Names), "createdAt": b.CreatedAt, "finishedAt": timeOrNil(b.FinishedAt),
				"status": dashStatus(b.Status), "statusMessage": dashStatusMessage(b.Build),
			})
			return
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("build %q not found", id))
}
