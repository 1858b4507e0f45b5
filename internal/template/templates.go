package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/dockerfile"
	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// DefaultTag is the tag a name without one means.
const DefaultTag = "default"

var (
	namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)
	tagPattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// buildRecord is what a build keeps in store.Build.Spec: the tags it
// gets when ready, and its Spec once started. The Spec's registry
// credentials are not in it: only their type, and the whole
// buildspec.RegistryAuth sealed in RegistrySealed (see sealRegistryAuth).
type buildRecord struct {
	Tags           []string        `json:"tags"`
	Spec           *buildspec.Spec `json:"spec,omitempty"`
	RegistrySealed string          `json:"registrySealed,omitempty"`
}

func readRecord(b store.Build) buildRecord {
	var r buildRecord
	_ = json.Unmarshal([]byte(b.Spec), &r)
	return r
}

func (r buildRecord) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// splitRef splits "[namespace/]name[:tag]", dropping the namespace (see
// parseRef).
func splitRef(ref string) (name, tag string) {
	_, name, tag = parseRef(ref)
	return name, tag
}

// parseRef splits "[namespace/]name[:tag]".
//
// Names are per team, as E2B's: "name" is the caller's team's template,
// and "team/name" is team's (its ID), which the caller may use if it is
// the caller's own team or the template is public. A namespace that
// names no public template of another team is taken as the caller's own
// team (Warren once had one name space and dropped namespaces), so that
// "ns/name" from before keeps working; it never reaches a private
// template of another team, and a bare name never reaches another team's
// template at all: a team cannot squat a name others use.
func parseRef(ref string) (namespace, name, tag string) {
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		namespace, ref = ref[:i], ref[i+1:]
	}
	name, tag, _ = strings.Cut(ref, ":")
	return namespace, name, tag
}

// CreateRequest asks for a new build of a template (POST /v3/templates):
// the template named Name is made if it does not exist.
type CreateRequest struct {
	TeamID    string
	CreatedBy string
	// Name is "name" or "name:tag"; its tag counts as one of Tags.
	Name string
	Tags []string
	// CPUCount and MemoryMB: 0 keeps the template's (or the default).
	CPUCount int
	MemoryMB int
}

// Created is a template with a new build waiting to be started.
type Created struct {
	Template store.Template
	BuildID  string
	Tags     []string
}

// Create makes a template (or takes the team's template of that name)
// and a new build of it, waiting for StartBuild.
func (b *Builder) Create(ctx context.Context, req CreateRequest) (Created, error) {
	name, tag := splitRef(req.Name)
	if name == "" {
		return Created{}, fmt.Errorf("%w: name is required", ErrInvalid)
	}
	if !namePattern.MatchString(name) {
		return Created{}, fmt.Errorf("%w: name %q must be lowercase letters, digits, '.', '_' or '-' (at most 128)", ErrInvalid, name)
	}
	tags := req.Tags
	if tag != "" {
		tags = append([]string{tag}, tags...)
	}
	tags, err := cleanTags(tags)
	if err != nil {
		return Created{}, err
	}
	if len(tags) == 0 {
		tags = []string{DefaultTag}
	}
	if err := b.checkResources(req.CPUCount, req.MemoryMB); err != nil {
		return Created{}, err
	}
	t, err := b.templateForBuild(ctx, req.TeamID, req.CreatedBy, name, req.CPUCount, req.MemoryMB)
	if err != nil {
		return Created{}, err
	}
	id, err := b.newBuild(ctx, t, buildRecord{Tags: tags})
	if err != nil {
		return Created{}, err
	}
	return Created{Template: t, BuildID: id, Tags: tags}, nil
}

func (b *Builder) checkResources(cpu, mem int) error {
	if cpu < 0 || cpu > 64 {
		return fmt.Errorf("%w: cpuCount must be between 1 and 64", ErrInvalid)
	}
	if mem < 0 || (mem > 0 && mem < 128) || mem > 256<<10 {
		return fmt.Errorf("%w: memoryMB must be between 128 and 262144", ErrInvalid)
	}
	return nil
}

func cleanTags(tags []string) ([]string, error) {
	var out []string
	for _, t := range tags {
		if !tagPattern.MatchString(t) {
			return nil, fmt.Errorf("%w: tag %q must be letters, digits, '.', '_' or '-' (at most 128)", ErrInvalid, t)
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out, nil
}

// templateForBuild returns the team's template called name, with new
// resources if given, or creates it.
func (b *Builder) templateForBuild(ctx context.Context, teamID, createdBy, name string, cpu, mem int) (store.Template, error) {
	update := func(t *store.Template) error {
		if t.TeamID != teamID { // names are per team: never the case
			return fmt.Errorf("%w: the template named %q changed meanwhile; retry", ErrConflict, name)
		}
		if cpu > 0 {
			t.CPUCount = cpu
		}
		if mem > 0 {
			t.MemoryMB = mem
		}
		t.UpdatedAt = time.Now()
		return nil
	}
	for attempt := 0; attempt < 3; attempt++ {
		t, err := b.cfg.Store.TemplateByName(ctx, teamID, name)
		if err == nil {
			return b.cfg.Store.UpdateTemplate(ctx, t.ID, update)
		}
		if !errors.Is(err, store.ErrNotFound) {
			return store.Template{}, err
		}
		if builtinName(name) {
			return store.Template{}, fmt.Errorf("%w: the name %q is a built-in template's", ErrConflict, name)
		}
		now := time.Now()
		t = store.Template{
			ID: sandbox.NewID(), TeamID: teamID, Names: []string{name}, CPUCount: cpu, MemoryMB: mem,
			CreatedAt: now, UpdatedAt: now, CreatedBy: createdBy,
		}
		if t.CPUCount == 0 {
			t.CPUCount = b.cfg.CPUCount
		}
		if t.MemoryMB == 0 {
			t.MemoryMB = b.cfg.MemoryMB
		}
		err = b.cfg.Store.CreateTemplate(ctx, t)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return store.Template{}, err
		}
		// Someone made it meanwhile: take it.
	}
	return store.Template{}, fmt.Errorf("%w: the name %q is being created concurrently; retry", ErrConflict, name)
}

// newBuild records a waiting build of t and counts it.
func (b *Builder) newBuild(ctx context.Context, t store.Template, rec buildRecord) (string, error) {
	now := time.Now()
	bd := store.Build{
		ID: newUUID(), TemplateID: t.ID, Status: store.BuildWaiting,
		CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
		EnvdVersion: envdinfo.Version, Spec: rec.String(), Node: b.cfg.NodeName,
		CreatedAt: now, UpdatedAt: now,
	}
	if err := b.cfg.Store.CreateBuild(ctx, bd); err != nil {
		return "", err
	}
	if _, err := b.cfg.Store.UpdateTemplate(ctx, t.ID, func(t *store.Template) error {
		t.BuildCount++
		t.UpdatedAt = now
		return nil
	}); err != nil {
		return "", err
	}
	return bd.ID, nil
}

// lookup finds a template by ID or name (any of "[ns/]name[:tag]"; the
// tag is returned) that team may see: its own or a public one.
func (b *Builder) lookup(ctx context.Context, teamID, ref string) (store.Template, string, error) {
	return lookupIn(ctx, b.cfg.Store, teamID, ref)
}

// BuildOf is the ready build that a team's template ref ("name",
// "name:tag", "namespace/name:tag" or an ID) names, from the store alone:
// a cluster's api places a sandbox by it, since the node that made the
// build holds its image. Built-in templates (base) have none.
func BuildOf(ctx context.Context, st store.TemplateStore, teamID, ref string) (store.Build, error) {
	t, tag, err := lookupIn(ctx, st, teamID, ref)
	if err != nil {
		return store.Build{}, err
	}
	return buildOfIn(ctx, st, t, tag)
}

func lookupIn(ctx context.Context, st store.TemplateStore, teamID, ref string) (store.Template, string, error) {
	notFound := fmt.Errorf("%w: template %q", ErrNotFound, ref)
	if teamID == "" {
		return store.Template{}, "", notFound
	}
	ns, name, tag := parseRef(ref)
	t, err := st.GetTemplate(ctx, name)
	switch {
	case err == nil && (t.TeamID == teamID || t.Public):
		return t, tag, nil
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return store.Template{}, "", err
	}
	t, err = templateByName(ctx, st, teamID, ns, name)
	if errors.Is(err, store.ErrNotFound) {
		return store.Template{}, "", notFound
	}
	return t, tag, err
}

// templateByName is the template a team means by namespace/name (see
// parseRef): ErrNotFound (from the store) for one it may not see.
func templateByName(ctx context.Context, st store.TemplateStore, teamID, ns, name string) (store.Template, error) {
	if ns != "" && ns != teamID {
		t, err := st.TemplateByName(ctx, ns, name)
		if err == nil && t.Public {
			return t, nil
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return store.Template{}, err
		}
		// Another team's private template is as absent as a missing one.
	}
	return st.TemplateByName(ctx, teamID, name)
}

// owned is lookup for changes: only the team's own templates.
func (b *Builder) owned(ctx context.Context, teamID, ref string) (store.Template, string, error) {
	t, tag, err := b.lookup(ctx, teamID, ref)
	if err == nil && t.TeamID != teamID {
		return store.Template{}, "", fmt.Errorf("%w: template %q belongs to another team", ErrForbidden, ref)
	}
	return t, tag, err
}

// Resolved is a template ready to start sandboxes from.
type Resolved struct {
	// TemplateID and Alias are what the sandbox's record says.
	TemplateID string
	Alias      string
	BuildID    string
	Image      *image.Template
	// CPUCount and MemoryMB of the build; 0 (the node's default) for
	// built-in templates but code-interpreter-v1's memory.
	CPUCount int
	MemoryMB int
}

// Resolve finds what a sandbox create's templateID means: a template ID,
// name, name:tag or namespace/name:tag of the team's or a public
// template (a name without a tag means its "default" tag, or its latest
// ready build), or a built-in template (base).
func (b *Builder) Resolve(ctx context.Context, teamID, ref string) (Resolved, error) {
	// Built-in first: no stored template can have its name (Create
	// refuses it) or ID, and base is what most creates ask for.
	var unbuilt error
	if name, tag := splitRef(ref); tag == "" || tag == DefaultTag || tag == "latest" {
		img, err := b.builtin(name)
		if err == nil {
			return Resolved{TemplateID: img.ID, Alias: img.ID, Image: img, MemoryMB: builtinMemoryMB(img.ID)}, nil
		}
		if errors.Is(err, ErrUnavailable) {
			unbuilt = err
		}
	}
	t, tag, err := b.lookup(ctx, teamID, ref)
	if errors.Is(err, ErrNotFound) && unbuilt != nil {
		// A team's template of an older Warren may have the name; if
		// not, the built-in one is coming.
		return Resolved{}, unbuilt
	}
	if err != nil {
		return Resolved{}, err
	}
	bd, err := b.buildOf(ctx, t, tag)
	if err != nil {
		return Resolved{}, err
	}
	img, err := b.image(ctx, t, bd)
	if errors.Is(err, blobstore.ErrCorrupt) {
		// The store's copy is refused; no node here can start it now.
		return Resolved{}, fmt.Errorf("%w: template %q: build %s: %v", ErrUnavailable, ref, bd.ID, err)
	}
	if err != nil {
		img, err = b.imageFromBlob(ctx, t, bd, err) // a snapshot kept in the blob store
	}
	if err != nil {
		return Resolved{}, b.noImage(ctx, ref, bd, err)
	}
	r := Resolved{TemplateID: t.ID, BuildID: bd.ID, Image: img, CPUCount: bd.CPUCount, MemoryMB: bd.MemoryMB}
	if len(t.Names) > 0 {
		r.Alias = t.Names[0]
	}
	return r, nil
}

// image is build bd's image (of template t, which the caller may use):
// this node's, else (in a cluster) pulled from the node that built it,
// once, else fetched from the blob store (blobs.go).
func (b *Builder) image(ctx context.Context, t store.Template, bd store.Build) (*image.Template, error) {
	img, err := b.cfg.Images.Template(bd.ID)
	if err == nil || !errors.Is(err, image.ErrNotFound) {
		return img, err
	}
	var pullErr error
	if b.cfg.Pull != nil && bd.Node != "" && bd.Node != b.cfg.NodeName {
		if pullErr = b.cfg.Pull(ctx, bd.Node, bd.ID); pullErr == nil {
			b.log.InfoContext(ctx, "template: pulled a build's image from the node that built it", "build", bd.ID, "template", bd.TemplateID, "from", bd.Node)
			return b.cfg.Images.Template(bd.ID)
		}
		pullErr = fmt.Errorf("from node %s: %w", bd.Node, pullErr)
	}
	if b.blobKeeper() == nil {
		if pullErr != nil {
			return nil, pullErr
		}
		return img, err
	}
	if ferr := b.fetchImage(ctx, t, bd); ferr != nil {
		if pullErr != nil {
			return nil, fmt.Errorf("%v; from the blob store: %w", pullErr, ferr)
		}
		return nil, fmt.Errorf("from the blob store: %w", ferr)
	}
	b.log.InfoContext(ctx, "template: fetched a build's image from the blob store", "build", bd.ID, "template", bd.TemplateID, "built_on", bd.Node, "pull_err", pullErr)
	return b.cfg.Images.Template(bd.ID)
}

// pulledSweepInterval is how often a node looks for the images it pulled
// whose template was deleted (on the node that built it).
const pulledSweepInterval = time.Minute

// forgetDeletedPulls removes the images this node pulled from others
// whose builds are gone from the store (their template deleted, through
// its home node): their records, checkpoints and warm pools. Layers stay,
// as a deleting node's do (the cache shares them).
func (b *Builder) forgetDeletedPulls(ctx context.Context) {
	ids, err := b.cfg.Images.Templates()
	if err != nil {
		b.log.Warn("template: listing images", "err", err)
		return
	}
	for _, id := range ids {
		img, err := b.cfg.Images.Template(id)
		if err != nil || img.PulledFrom == "" {
			continue
		}
		if _, err := b.cfg.Store.GetBuild(ctx, id); !errors.Is(err, store.ErrNotFound) {
			continue
		}
		b.log.Info("template: removing the image of a deleted template, pulled from another node", "build", id, "from", img.PulledFrom)
		_ = b.cfg.Images.RemoveTemplate(id)
		if img.Snapshot != "" {
			_ = b.cfg.Images.RemoveSnapshot(img.Snapshot)
		}
		if b.cfg.ImageRemoved != nil {
			b.cfg.ImageRemoved(id)
		}
	}
}

// SandboxTemplate is Resolve for the sandbox manager
// (sandbox.Config.Resolve): an unknown template is its
// ErrTemplateNotFound, and a stored template's spawn is counted.
func (b *Builder) SandboxTemplate(ctx context.Context, teamID, ref string) (sandbox.Template, error) {
	r, err := b.Resolve(ctx, teamID, ref)
	if errors.Is(err, ErrNotFound) {
		return sandbox.Template{}, fmt.Errorf("%w: %v", sandbox.ErrTemplateNotFound, err)
	}
	if errors.Is(err, ErrUnavailable) {
		return sandbox.Template{}, fmt.Errorf("%w: %v", sandbox.ErrNodeUnavailable, err)
	}
	if err != nil {
		return sandbox.Template{}, err
	}
	if r.BuildID != "" {
		b.Spawned(context.WithoutCancel(ctx), r.TemplateID)
	}
	return sandbox.Template{ID: r.TemplateID, Alias: r.Alias, Image: r.Image, CPUCount: r.CPUCount, MemoryMB: r.MemoryMB}, nil
}

// buildOf is the ready build a tag ("" = default) of t points at.
func (b *Builder) buildOf(ctx context.Context, t store.Template, tag string) (store.Build, error) {
	return buildOfIn(ctx, b.cfg.Store, t, tag)
}

// buildOfIn is buildOf. As in E2B, where a tag names none, it may be the
// ID of one of t's ready builds ("name:buildID": E2B's dashboard assigns
// tags so).
func buildOfIn(ctx context.Context, st store.TemplateStore, t store.Template, tag string) (store.Build, error) {
	explicit := tag != ""
	if tag == "" {
		tag = DefaultTag
	}
	tg, err := st.GetTag(ctx, t.ID, tag)
	if err == nil {
		return st.GetBuild(ctx, tg.BuildID)
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.Build{}, err
	}
	builds, err := st.ListBuilds(ctx, t.ID)
	if err != nil {
		return store.Build{}, err
	}
	if explicit {
		for _, bd := range builds {
			if bd.ID == tag && bd.Status == store.BuildReady {
				return bd, nil
			}
		}
		return store.Build{}, fmt.Errorf("%w: template %s has no tag %q", ErrNotFound, t.ID, tag)
	}
	for i := len(builds) - 1; i >= 0; i-- {
		if builds[i].Status == store.BuildReady {
			return builds[i], nil
		}
	}
	return store.Build{}, fmt.Errorf("%w: template %s has no ready build yet", ErrNotFound, t.ID)
}

// Spawned counts a sandbox started from template id.
func (b *Builder) Spawned(ctx context.Context, id string) {
	_, _ = b.cfg.Store.UpdateTemplate(ctx, id, func(t *store.Template) error {
		t.SpawnCount++
		t.LastSpawnedAt = time.Now()
		return nil
	})
}

// TemplateInfo is a template with its builds, oldest first.
type TemplateInfo struct {
	store.Template
	Builds []store.Build
}

// Last is the newest build (nil if none).
func (t TemplateInfo) Last() *store.Build {
	if len(t.Builds) == 0 {
		return nil
	}
	return &t.Builds[len(t.Builds)-1]
}

// LastReady is the newest ready build (nil if none).
func (t TemplateInfo) LastReady() *store.Build {
	for i := len(t.Builds) - 1; i >= 0; i-- {
		if t.Builds[i].Status == store.BuildReady {
			return &t.Builds[i]
		}
	}
	return nil
}

// List lists the team's templates.
func (b *Builder) List(ctx context.Context, teamID string) ([]TemplateInfo, error) {
	ts, err := b.cfg.Store.ListTemplates(ctx, teamID)
	if err != nil {
		return nil, err
	}
	out := make([]TemplateInfo, 0, len(ts))
	for _, t := range ts {
		builds, err := b.cfg.Store.ListBuilds(ctx, t.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, TemplateInfo{t, builds})
	}
	return out, nil
}

// Get returns a template the team may see, by ID or name.
func (b *Builder) Get(ctx context.Context, teamID, ref string) (TemplateInfo, error) {
	t, _, err := b.lookup(ctx, teamID, ref)
	if err != nil {
		return TemplateInfo{}, err
	}
	builds, err := b.cfg.Store.ListBuilds(ctx, t.ID)
	if err != nil {
		return TemplateInfo{}, err
	}
	return TemplateInfo{t, builds}, nil
}

// Delete removes one of the team's templates: its running builds are
// cancelled, and its records, build images, uploaded files and the
// snapshots it took of sandboxes are deleted. Layers and start-command
// snapshots stay: other templates and the cache share them.
// Sandboxes running from it keep running.
func (b *Builder) Delete(ctx context.Context, teamID, ref string) error {
	t, _, err := b.owned(ctx, teamID, ref)
	if err != nil {
		return err
	}
	builds, err := b.cfg.Store.ListBuilds(ctx, t.ID)
	if err != nil {
		return err
	}
	for _, bd := range builds {
		b.cancel(bd.ID)
	}
	blobs := b.snapshotBlobsOf(ctx, t, builds)
	if err := b.cfg.Store.DeleteTemplate(ctx, t.ID); err != nil {
		return err
	}
	errs := []error{b.removeSnapshotFiles(builds), b.dropSnapshotBlobs(ctx, blobs)}
	for _, bd := range builds {
		errs = append(errs, b.cfg.Images.RemoveTemplate(bd.ID))
		if b.cfg.ImageRemoved != nil {
			b.cfg.ImageRemoved(bd.ID)
		}
	}
	errs = append(errs, b.removeUploads(t.ID))
	errs = append(errs, b.releaseBlobs(ctx, t.TeamID))
	if err := errors.Join(errs...); err != nil {
		b.log.WarnContext(ctx, "deleting a template's files", "template", t.ID, "err", err)
	}
	return nil
}

// cancel stops a running build and waits until it has cleaned up (its
// sandbox goes within seconds).
func (b *Builder) cancel(buildID string) {
	b.mu.Lock()
	r, ok := b.running[buildID]
	b.mu.Unlock()
	if ok {
		r.cancel()
		<-r.done
	}
}

// Alias tells whether a template name ("name" or "team/name", see
// parseRef) exists for the team: its template's ID and whether it is
// public. Another team's private template is not found, as a name nobody
// has: the answer reveals nothing of other teams.
func (b *Builder) Alias(ctx context.Context, teamID, ref string) (store.Template, error) {
	ns, name, _ := parseRef(ref)
	if teamID == "" {
		return store.Template{}, fmt.Errorf("%w: template name %q", ErrNotFound, ref)
	}
	t, err := templateByName(ctx, b.cfg.Store, teamID, ns, name)
	if errors.Is(err, store.ErrNotFound) {
		if img, ierr := b.builtin(name); ierr == nil {
			return store.Template{ID: img.ID, Names: []string{img.ID}, Public: true}, nil
		}
		return store.Template{}, fmt.Errorf("%w: template name %q", ErrNotFound, ref)
	}
	if err != nil {
		return store.Template{}, err
	}
	return t, nil
}

// AssignTags points tags at the build that target ("name:tag"; "name" =
// its default tag) points at, and returns that build's ID.
func (b *Builder) AssignTags(ctx context.Context, teamID, target string, tags []string) (string, []string, error) {
	tags, err := cleanTags(tags)
	if err != nil {
		return "", nil, err
	}
	if len(tags) == 0 {
		return "", nil, fmt.Errorf("%w: tags must not be empty", ErrInvalid)
	}
	t, tag, err := b.owned(ctx, teamID, target)
	if err != nil {
		return "", nil, err
	}
	bd, err := b.buildOf(ctx, t, tag)
	if err != nil {
		return "", nil, err
	}
	for _, tg := range tags {
		if err := b.cfg.Store.SetTag(ctx, store.Tag{TemplateID: t.ID, Tag: tg, BuildID: bd.ID, CreatedAt: time.Now()}); err != nil {
			return "", nil, err
		}
	}
	return bd.ID, tags, nil
}

// RemoveTags removes tags from the team's template name.
func (b *Builder) RemoveTags(ctx context.Context, teamID, name string, tags []string) error {
	if len(tags) == 0 {
		return fmt.Errorf("%w: tags must not be empty", ErrInvalid)
	}
	t, _, err := b.owned(ctx, teamID, name)
	if err != nil {
		return err
	}
	for _, tg := range tags {
		if err := b.cfg.Store.DeleteTag(ctx, t.ID, tg); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%w: template %q has no tag %q", ErrNotFound, name, tg)
			}
			return err
		}
	}
	return nil
}

// Tags lists a template's tags.
func (b *Builder) Tags(ctx context.Context, teamID, ref string) ([]store.Tag, error) {
	t, _, err := b.lookup(ctx, teamID, ref)
	if err != nil {
		return nil, err
	}
	return b.cfg.Store.ListTags(ctx, t.ID)
}

// Status is a build's state and a page of its log.
type Status struct {
	Build store.Build
	Logs  []store.BuildLogEntry
}

// Status returns build buildID of template templateID with up to limit
// log entries from offset on (of level minLevel or more severe).
func (b *Builder) Status(ctx context.Context, teamID, templateID, buildID string, offset, limit int, minLevel string) (Status, error) {
	t, _, err := b.lookup(ctx, teamID, templateID)
	if err != nil {
		return Status{}, err
	}
	bd, err := b.cfg.Store.GetBuild(ctx, buildID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && bd.TemplateID != t.ID) {
		return Status{}, fmt.Errorf("%w: build %s of template %s", ErrNotFound, buildID, templateID)
	}
	if err != nil {
		return Status{}, err
	}
	logs, err := b.cfg.Store.BuildLogs(ctx, buildID, offset, limit, minLevel)
	if err != nil {
		return Status{}, err
	}
	return Status{Build: bd, Logs: logs}, nil
}

// builtin returns a built-in template (base, code-interpreter-v1, mcp-gateway), which
// every team may use. One that `warren setup` has not built (yet) is
// ErrUnavailable.
func (b *Builder) builtin(name string) (*image.Template, error) {
	if !builtinName(name) {
		return nil, fmt.Errorf("%w: template %q", ErrNotFound, name)
	}
	t, err := b.cfg.Images.Template(name)
	if err != nil && name == baseimage.CodeInterpreterID {
		if b.cfg.Pending != nil {
			if why := b.cfg.Pending(name); why != "" {
				return nil, fmt.Errorf("%w: %s", ErrUnavailable, why)
			}
		}
		return nil, fmt.Errorf("%w: the %s template is not built on this node yet (`warren setup` builds it, or `warren serve --build-code-interpreter` in the background)", ErrUnavailable, name)
	}
	if err != nil && name == baseimage.MCPGatewayID {
		return nil, fmt.Errorf("%w: the %s template is not built on this node: `warren serve` builds it at start from the mcp-gateway binary beside envd (`make build` makes it)", ErrUnavailable, name)
	}
	return t, err
}

// builtinMemoryMB is a built-in template's memory; 0 (the node's
// default) but for the code interpreter's.
func builtinMemoryMB(id string) int {
	if id == baseimage.CodeInterpreterID {
		return baseimage.CodeInterpreterMemoryMB
	}
	return 0
}

// builtinName tells whether name is a built-in template's, which no
// team's template may take.
func builtinName(name string) bool {
	return name == baseimage.TemplateID || name == baseimage.CodeInterpreterID || name == baseimage.MCPGatewayID
}

// dockerfileSpec is the build a Dockerfile request asks for. COPY and ADD
// need files uploaded by the SDK's flow, which these requests have no
// room for, so they are refused.
func dockerfileSpec(req RebuildRequest) (buildspec.Spec, error) {
	spec, err := dockerfile.Parse(req.Dockerfile)
	if err != nil {
		return buildspec.Spec{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for i, st := range spec.Steps {
		if st.Type == "COPY" {
			return buildspec.Spec{}, fmt.Errorf("%w: step %d: COPY/ADD need the build context's files, which this endpoint cannot receive: build with the SDK or `warren template build`", ErrInvalid, i+1)
		}
	}
	if req.StartCmd != nil {
		spec.StartCmd = *req.StartCmd
	}
	if req.ReadyCmd != nil {
		spec.ReadyCmd = *req.ReadyCmd
	}
	if spec.StartCmd == "" {
		spec.ReadyCmd = ""
	}
	return spec, nil
}

// CreateFromDockerfile is E2B's first template call (POST /templates):
// the team's template named req.Alias, made if it is new, and a build of
// it from the Dockerfile, started at once. The request is checked whole
// before anything is made.
func (b *Builder) CreateFromDockerfile(ctx context.Context, teamID string, req RebuildRequest) (TemplateInfo, error) {
	if req.Alias == "" {
		return TemplateInfo{}, fmt.Errorf("%w: alias is required: Warren's templates are started by name", ErrInvalid)
	}
	spec, err := dockerfileSpec(req)
	if err != nil {
		return TemplateInfo{}, err
	}
	if err := spec.Validate(); err != nil {
		return TemplateInfo{}, err
	}
	c, err := b.Create(ctx, CreateRequest{TeamID: teamID, Name: req.Alias, CPUCount: req.CPUCount, MemoryMB: req.MemoryMB})
	if err != nil {
		return TemplateInfo{}, err
	}
	if err := b.StartBuild(ctx, teamID, c.Template.ID, c.BuildID, spec); err != nil {
		return TemplateInfo{}, err
	}
	return b.Get(ctx, teamID, c.Template.ID)
}

// SetPublic publishes (every team may start sandboxes from it) or
// unpublishes one of the team's templates.
func (b *Builder) SetPublic(ctx context.Context, teamID, ref string, public bool) (store.Template, error) {
	t, _, err := b.owned(ctx, teamID, ref)
	if err != nil {
		return store.Template{}, err
	}
	return b.cfg.Store.UpdateTemplate(ctx, t.ID, func(x *store.Template) error {
		x.Public, x.UpdatedAt = public, time.Now()
		return nil
	})
}

// RebuildRequest is POST /templates/{templateID}: a new build of the
// team's template from a Dockerfile.
type RebuildRequest struct {
	Dockerfile string
	// Alias, if set, becomes one of the template's names.
	Alias string
	// StartCmd and ReadyCmd, if not nil, replace the Dockerfile's
	// CMD/ENTRYPOINT and its default ready command.
	StartCmd, ReadyCmd *string
	CPUCount, MemoryMB int
}

// Rebuild starts a new build of the team's template from a Dockerfile.
// COPY and ADD need files uploaded by the SDK's flow, which this request
// has no room for, so they are refused.
func (b *Builder) Rebuild(ctx context.Context, teamID, templateID string, req RebuildRequest) (TemplateInfo, error) {
	spec, err := dockerfileSpec(req)
	if err != nil {
		return TemplateInfo{}, err
	}
	if err := b.checkResources(req.CPUCount, req.MemoryMB); err != nil {
		return TemplateInfo{}, err
	}
	if req.Alias != "" && !namePattern.MatchString(req.Alias) {
		return TemplateInfo{}, fmt.Errorf("%w: alias %q must be lowercase letters, digits, '.', '_' or '-'", ErrInvalid, req.Alias)
	}
	t, _, err := b.owned(ctx, teamID, templateID)
	if err != nil {
		return TemplateInfo{}, err
	}
	if err := b.validate(t.ID, &spec); err != nil {
		return TemplateInfo{}, err
	}
	t, err = b.cfg.Store.UpdateTemplate(ctx, t.ID, func(x *store.Template) error {
		if req.Alias != "" && !slices.Contains(x.Names, req.Alias) {
			x.Names = append(x.Names, req.Alias)
		}
		if req.CPUCount > 0 {
			x.CPUCount = req.CPUCount
		}
		if req.MemoryMB > 0 {
			x.MemoryMB = req.MemoryMB
		}
		return nil
	})
	if errors.Is(err, store.ErrConflict) {
		return TemplateInfo{}, fmt.Errorf("%w: the name %q is taken", ErrConflict, req.Alias)
	}
	if err != nil {
		return TemplateInfo{}, err
	}
	rec := buildRecord{Tags: []string{DefaultTag}, Spec: &spec}
	id, err := b.newBuild(ctx, t, rec)
	if err != nil {
		return TemplateInfo{}, err
	}
	bd, err := b.cfg.Store.GetBuild(ctx, id)
	if err != nil {
		return TemplateInfo{}, err
	}
	if err := b.launch(bd, t, rec); err != nil {
		return TemplateInfo{}, err
	}
	return b.Get(ctx, teamID, t.ID)
}
