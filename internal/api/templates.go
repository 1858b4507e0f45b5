package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/template"
)

// The template endpoints: POST /v3/templates, file uploads, build start
// and status, the Dockerfile rebuild, and listing, aliases and tags. What
// a build does is internal/template's.

// failTemplate maps the builder's errors to statuses.
func (s *Server) failTemplate(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, template.ErrNotFound), errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, template.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, template.ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
	case errors.Is(err, template.ErrForbidden):
		writeError(w, http.StatusForbidden, err.Error())
	case errors.Is(err, template.ErrUnavailable):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case errors.Is(err, template.ErrConflict), errors.Is(err, store.ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		writeError(w, 499, "client closed request")
	default:
		s.internal(w, r, err)
	}
}

func int32OrZero(p *int32) int {
	if p == nil {
		return 0
	}
	return int(*p)
}

func (s *Server) CreateTemplateV3(w http.ResponseWriter, r *http.Request) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	var body gen.TemplateBuildRequestV3
	if !readJSON(w, r, &body, false) {
		return
	}
	if err := s.checkResources(body.CpuCount, body.MemoryMB); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	name := deref(body.Name)
	if name == "" {
		name = deref(body.Alias) // deprecated spelling
	}
	c, err := b.Create(r.Context(), template.CreateRequest{
		TeamID: teamOf(r), Name: name, Tags: deref(body.Tags),
		CPUCount: int32OrZero(body.CpuCount), MemoryMB: int32OrZero(body.MemoryMB),
	})
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, gen.TemplateRequestResponseV3{
		TemplateID: c.Template.ID, BuildID: c.BuildID, Names: orEmptyList(c.Template.Names),
		Aliases: orEmptyList(c.Template.Names), Tags: c.Tags, Public: c.Template.Public,
	})
}

func orEmptyList(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// apiURL is the API's base URL as this client reached it, for URLs the
// client is to call back.
func apiURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if p := r.Header.Get("X-Forwarded-Proto"); p == "https" || p == "http" {
		scheme = p
	}
	return scheme + "://" + r.Host
}

func (s *Server) GetTemplateFiles(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID, hash string) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	present, url, err := b.FileStatus(r.Context(), teamOf(r), templateID, hash, apiURL(r))
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, gen.TemplateBuildFileUpload{Present: present, Url: &url, Headers: &map[string]string{}})
}

func (s *Server) UploadTemplateFiles(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID, hash string, params gen.UploadTemplateFilesParams) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	if s.diskFull(w, r) {
		return
	}
	extendDeadlines(w, s.cfg.UploadTimeout)
	if err := b.Upload(r.Context(), templateID, hash, params.Expires, params.Signature, r.Body); err != nil {
		s.failTemplate(w, r, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func (s *Server) StartTemplateBuildV2(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID, buildID gen.BuildID) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	var body gen.TemplateBuildStartV2
	if !readJSON(w, r, &body, false) {
		return
	}
	spec := buildspec.Spec{
		FromImage: deref(body.FromImage), FromTemplate: deref(body.FromTemplate),
		StartCmd: deref(body.StartCmd), ReadyCmd: deref(body.ReadyCmd), Force: deref(body.Force),
		Steps: []buildspec.Step{},
	}
	if reg := body.FromImageRegistry; reg != nil {
		spec.FromImageRegistry = &buildspec.RegistryAuth{
			Type: reg.Type, Username: deref(reg.Username), Password: deref(reg.Password),
			AwsAccessKeyID: deref(reg.AwsAccessKeyId), AwsSecretAccessKey: deref(reg.AwsSecretAccessKey),
			AwsRegion: deref(reg.AwsRegion), ServiceAccountJSON: deref(reg.ServiceAccountJson),
		}
	}
	for _, st := range deref(body.Steps) {
		spec.Steps = append(spec.Steps, buildspec.Step{Type: st.Type, Args: deref(st.Args), FilesHash: deref(st.FilesHash), Force: deref(st.Force)})
	}
	if s.diskFull(w, r) || s.overDiskQuota(w, r, 0, "the template") {
		return
	}
	if err := b.StartBuild(r.Context(), teamOf(r), templateID, buildID, spec); err != nil {
		s.failTemplate(w, r, err)
		return
	}
	// The SDK insists on an empty body with a Content-Length of 0.
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) GetTemplateBuildStatus(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID, buildID gen.BuildID, params gen.GetTemplateBuildStatusParams) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	offset, limit := int32OrZero(params.LogsOffset), 100
	if params.Limit != nil {
		limit = int(*params.Limit)
	}
	if offset < 0 {
		writeError(w, http.StatusBadRequest, "logsOffset must not be negative")
		return
	}
	if limit < 0 || limit > 100 {
		writeError(w, http.StatusBadRequest, "limit must be between 0 and 100")
		return
	}
	level := ""
	if params.Level != nil {
		level = strings.ToLower(string(*params.Level))
		switch level {
		case "debug", "info", "warn", "error":
		default:
			writeError(w, http.StatusBadRequest, "level must be debug, info, warn or error")
			return
		}
	}
	st, err := b.Status(r.Context(), teamOf(r), templateID, buildID, offset, limit, level)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	info := gen.TemplateBuildInfo{
		TemplateID: st.Build.TemplateID, BuildID: st.Build.ID, Status: gen.TemplateBuildStatus(st.Build.Status),
		Logs: []string{}, LogEntries: logEntries(st.Logs),
	}
	for _, e := range st.Logs {
		info.Logs = append(info.Logs, e.Message)
	}
	if st.Build.Status == store.BuildError {
		info.Reason = &gen.BuildStatusReason{Message: st.Build.ReasonMessage, Step: nonEmpty(st.Build.ReasonStep)}
	}
	writeJSON(w, http.StatusOK, info)
}

func logEntries(l []store.BuildLogEntry) []gen.BuildLogEntry {
	out := make([]gen.BuildLogEntry, 0, len(l))
	for _, e := range l {
		out = append(out, gen.BuildLogEntry{Timestamp: e.Time, Level: gen.LogLevel(e.Level), Message: e.Message, Step: nonEmpty(e.Step)})
	}
	return out
}

func (s *Server) RebuildTemplate(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID) {
	b, req, ok := s.dockerfileBuild(w, r)
	if !ok {
		return
	}
	info, err := b.Rebuild(r.Context(), teamOf(r), templateID, req)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, templateOf(info))
}

// dockerfileBuild reads and checks the body of E2B's v1 template calls
// (a Dockerfile and resources), and checks the node's disk and the team's
// quota; on false it has answered.
func (s *Server) dockerfileBuild(w http.ResponseWriter, r *http.Request) (Templates, template.RebuildRequest, bool) {
	b, ok := s.templates(w)
	if !ok {
		return nil, template.RebuildRequest{}, false
	}
	var body gen.TemplateBuildRequest
	if !readJSON(w, r, &body, false) {
		return nil, template.RebuildRequest{}, false
	}
	if err := s.checkResources(body.CpuCount, body.MemoryMB); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, template.RebuildRequest{}, false
	}
	if strings.TrimSpace(body.Dockerfile) == "" {
		writeError(w, http.StatusBadRequest, "dockerfile is required")
		return nil, template.RebuildRequest{}, false
	}
	if s.diskFull(w, r) || s.overDiskQuota(w, r, 0, "the template") {
		return nil, template.RebuildRequest{}, false
	}
	return b, template.RebuildRequest{
		Dockerfile: body.Dockerfile, Alias: deref(body.Alias), StartCmd: body.StartCmd, ReadyCmd: body.ReadyCmd,
		CPUCount: int32OrZero(body.CpuCount), MemoryMB: int32OrZero(body.MemoryMB),
	}, true
}

// templateOf is a template as GET /templates lists it: its newest build
// (what buildID and buildStatus describe) and its counters.
func templateOf(t template.TemplateInfo) gen.Template {
	out := gen.Template{
		TemplateID: t.ID, CpuCount: int32(t.CPUCount), MemoryMB: int32(t.MemoryMB), DiskSizeMB: int32(t.DiskSizeMB),
		Public: t.Public, Aliases: orEmptyList(t.Names), CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
		SpawnCount: t.SpawnCount, BuildCount: int32(t.BuildCount), EnvdVersion: envdinfo.Version,
		LastSpawnedAt: timeOrNil(t.LastSpawnedAt),
	}
	out.Names = orEmptyList(t.Names)
	// Every template has a build (a create makes one); "waiting" stands
	// for none, which the spec's required field cannot leave out.
	out.BuildStatus = gen.TemplateBuildStatus(store.BuildWaiting)
	if last := t.Last(); last != nil {
		out.BuildID = last.ID
		out.BuildStatus = gen.TemplateBuildStatus(last.Status)
	}
	return out
}

// CreateTemplateLegacy is E2B's v1 create: a template built from a
// Dockerfile, the build started at once.
func (s *Server) CreateTemplateLegacy(w http.ResponseWriter, r *http.Request) {
	b, req, ok := s.dockerfileBuild(w, r)
	if !ok {
		return
	}
	info, err := b.CreateFromDockerfile(r.Context(), teamOf(r), req)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, templateOf(info))
}

// CreateTemplateV2 is E2B's v2 create: POST /v3/templates under its old
// name, answered as a template.
func (s *Server) CreateTemplateV2(w http.ResponseWriter, r *http.Request) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	var body gen.TemplateBuildRequestV2
	if !readJSON(w, r, &body, false) {
		return
	}
	if err := s.checkResources(body.CpuCount, body.MemoryMB); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	c, err := b.Create(r.Context(), template.CreateRequest{
		TeamID: teamOf(r), Name: body.Alias,
		CPUCount: int32OrZero(body.CpuCount), MemoryMB: int32OrZero(body.MemoryMB),
	})
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	info, err := b.Get(r.Context(), teamOf(r), c.Template.ID)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	out := templateOf(info)
	// buildID is the new build's, which the client starts next (Get's
	// newest build is it, unless a concurrent create made another).
	out.BuildID, out.BuildStatus = c.BuildID, gen.TemplateBuildStatus(store.BuildWaiting)
	writeJSON(w, http.StatusAccepted, out)
}

// StartTemplateBuildLegacy is E2B's v1 build trigger, which followed a
// push of the build's image to E2B's registry. Warren has none: the v1
// create started its build from the Dockerfile already.
func (s *Server) StartTemplateBuildLegacy(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID, buildID gen.BuildID) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	st, err := b.Status(r.Context(), teamOf(r), templateID, buildID, 0, 0, "")
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	if st.Build.Status == store.BuildWaiting && st.Build.Spec == "" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(
			"build %s has no steps yet: start it with POST /v2/templates/%s/builds/%s (Warren has no image registry to build a pushed image from)",
			buildID, templateID, buildID))
		return
	}
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
}

// maxTemplatePage is the page size of GET /v2/templates, and its default.
const maxTemplatePage = 100

func (s *Server) ListTemplatesV2(w http.ResponseWriter, r *http.Request, params gen.ListTemplatesV2Params) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	limit := maxTemplatePage
	if params.Limit != nil {
		if *params.Limit < 1 || *params.Limit > maxTemplatePage {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be between 1 and %d", maxTemplatePage))
			return
		}
		limit = int(*params.Limit)
	}
	var after *store.Cursor
	if params.NextToken != nil && *params.NextToken != "" {
		c, desc, err := parseToken(*params.NextToken)
		if err != nil || desc {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid nextToken %q", *params.NextToken))
			return
		}
		after = &c
	}
	list, err := b.List(r.Context(), teamOf(r))
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	// The list is oldest first, by (created, ID): a page is what follows
	// the cursor.
	out := make([]gen.Template, 0, min(limit, len(list)))
	for _, t := range list {
		if after != nil && !cursorAfter(t.CreatedAt, t.ID, *after) {
			continue
		}
		if len(out) == limit {
			last := out[len(out)-1]
			w.Header().Set("X-Next-Token", makeToken(store.Cursor{StartedAt: last.CreatedAt, ID: last.TemplateID}, false))
			break
		}
		out = append(out, templateOf(t))
	}
	writeJSON(w, http.StatusOK, out)
}

// cursorAfter tells whether (at, id) comes after c in ascending order.
func cursorAfter(at time.Time, id string, c store.Cursor) bool {
	if !at.Equal(c.StartedAt) {
		return at.After(c.StartedAt)
	}
	return id > c.ID
}

// setPublic is both PATCH /templates/{id} and PATCH /v2/templates/{id};
// it answers false after an error.
func (s *Server) setPublic(w http.ResponseWriter, r *http.Request, templateID string) (store.Template, bool) {
	b, ok := s.templates(w)
	if !ok {
		return store.Template{}, false
	}
	var body gen.TemplateUpdateRequest
	if !readJSON(w, r, &body, true) {
		return store.Template{}, false
	}
	if body.Public == nil {
		// Nothing to change (E2B's answer too); the template must still
		// be the team's.
		info, err := b.Get(r.Context(), teamOf(r), templateID)
		if err == nil && info.TeamID != teamOf(r) {
			err = fmt.Errorf("%w: template %q belongs to another team", template.ErrForbidden, templateID)
		}
		if err != nil {
			s.failTemplate(w, r, err)
			return store.Template{}, false
		}
		return info.Template, true
	}
	t, err := b.SetPublic(r.Context(), teamOf(r), templateID, *body.Public)
	if err != nil {
		s.failTemplate(w, r, err)
		return store.Template{}, false
	}
	return t, true
}

func (s *Server) UpdateTemplate(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID) {
	if _, ok := s.setPublic(w, r, templateID); ok {
		writeJSON(w, http.StatusOK, nil)
	}
}

func (s *Server) UpdateTemplateV2(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID) {
	if t, ok := s.setPublic(w, r, templateID); ok {
		writeJSON(w, http.StatusOK, gen.TemplateUpdateResponse{Names: orEmptyList(t.Names)})
	}
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (s *Server) ListTemplates(w http.ResponseWriter, r *http.Request, params gen.ListTemplatesParams) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	list, err := b.List(r.Context(), teamOf(r))
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	out := make([]gen.Template, 0, len(list))
	for _, t := range list {
		out = append(out, templateOf(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) GetTemplate(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	t, err := b.Get(r.Context(), teamOf(r), templateID)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	out := gen.TemplateWithBuilds{
		TemplateID: t.ID, Names: orEmptyList(t.Names), Aliases: orEmptyList(t.Names), Public: t.Public,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, LastSpawnedAt: timeOrNil(t.LastSpawnedAt),
		SpawnCount: t.SpawnCount, Builds: []gen.TemplateBuild{},
	}
	for _, bd := range t.Builds {
		disk, envd := int32(bd.DiskSizeMB), bd.EnvdVersion
		out.Builds = append(out.Builds, gen.TemplateBuild{
			BuildID: bd.ID, Status: gen.TemplateBuildStatus(bd.Status), CpuCount: int32(bd.CPUCount),
			MemoryMB: int32(bd.MemoryMB), DiskSizeMB: &disk, EnvdVersion: &envd,
			CreatedAt: bd.CreatedAt, UpdatedAt: bd.UpdatedAt, FinishedAt: timeOrNil(bd.FinishedAt),
		})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) DeleteTemplate(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	if err := b.Delete(r.Context(), teamOf(r), templateID); err != nil {
		s.failTemplate(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateAlias is openapi.yml's TemplateAliasResponse, whose generated
// type goes with the excluded operation (see routeAlias).
type templateAlias struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

func (s *Server) GetTemplateAlias(w http.ResponseWriter, r *http.Request, alias string) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	t, err := b.Alias(r.Context(), teamOf(r), alias)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateAlias{TemplateID: t.ID, Public: t.Public})
}

func (s *Server) AssignTemplateTags(w http.ResponseWriter, r *http.Request) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	var body gen.AssignTemplateTagsRequest
	if !readJSON(w, r, &body, false) {
		return
	}
	buildID, tags, err := b.AssignTags(r.Context(), teamOf(r), body.Target, body.Tags)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, gen.AssignedTemplateTags{BuildID: buildID, Tags: tags})
}

func (s *Server) DeleteTemplateTags(w http.ResponseWriter, r *http.Request) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	var body gen.DeleteTemplateTagsRequest
	if !readJSON(w, r, &body, false) {
		return
	}
	if err := b.RemoveTags(r.Context(), teamOf(r), body.Name, body.Tags); err != nil {
		s.failTemplate(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) ListTemplateTags(w http.ResponseWriter, r *http.Request, templateID gen.TemplateID) {
	b, ok := s.templates(w)
	if !ok {
		return
	}
	tags, err := b.Tags(r.Context(), teamOf(r), templateID)
	if err != nil {
		s.failTemplate(w, r, err)
		return
	}
	out := make([]gen.TemplateTag, 0, len(tags))
	for _, t := range tags {
		out = append(out, gen.TemplateTag{Tag: t.Tag, BuildID: t.BuildID, CreatedAt: t.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

// templates is the template service, or false after a 501 where this
// server has none (an api process of a cluster: templates are built on
// nodes, not yet through it).
func (s *Server) templates(w http.ResponseWriter) (Templates, bool) {
	if s.cfg.Templates == nil {
		writeError(w, http.StatusNotImplemented, "templates and snapshots are not served by a --role api process yet: build them on a --role all server")
		return nil, false
	}
	return s.cfg.Templates, true
}
