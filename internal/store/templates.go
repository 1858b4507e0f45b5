package store

import (
	"context"
	"time"
)

// Template is a template's record: the name users start sandboxes from,
// its owner and its default resources. What it is made of is in its
// builds; which build a name (or name:tag) means is in its tags.
type Template struct {
	ID     string
	TeamID string
	// Names are the template's aliases. A name belongs to one template
	// of its team; other teams may have templates of the same name.
	Names  []string
	Public bool
	// Resources of the last build request, given to its sandboxes.
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
	CreatedAt  time.Time
	UpdatedAt  time.Time
	// LastSpawnedAt is zero if no sandbox was ever started from it.
	LastSpawnedAt time.Time
	SpawnCount    int64
	BuildCount    int
	// CreatedBy is the ID of the key that created it ("" if unknown).
	CreatedBy string
	// SnapshotOf is the sandbox a snapshot template was taken from (its
	// latest snapshot's); "" for a built template.
	SnapshotOf string
}

// SnapshotFilter selects a team's snapshot templates (templates with a
// SnapshotOf), newest first.
type SnapshotFilter struct {
	TeamID string
	// SandboxID, if set, keeps the snapshots of that sandbox.
	SandboxID string
	// Name, if set, keeps the template that has that name.
	Name string
	// After continues a listing: templates created before this cursor
	// (its StartedAt is the template's CreatedAt).
	After *Cursor
	// Limit bounds the result; 0 means no limit.
	Limit int
}

// BuildStatus is a template build's state: waiting → building → ready |
// error.
type BuildStatus string

const (
	BuildWaiting  BuildStatus = "waiting"
	BuildBuilding BuildStatus = "building"
	BuildReady    BuildStatus = "ready"
	BuildError    BuildStatus = "error"
)

// Build is one build of a template.
type Build struct {
	ID         string
	TemplateID string
	Status     BuildStatus
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
	// EnvdVersion is the envd the build's sandboxes run.
	EnvdVersion string
	// Spec is the build's request as JSON (base, steps, start and ready
	// commands); empty until the build is started.
	Spec string
	// ReasonMessage and ReasonStep say why a build failed ("base", "1"…,
	// "finalize"); set only with BuildError.
	ReasonMessage string
	ReasonStep    string
	// Node is the node that runs (or ran) the build.
	Node       string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time // zero until ready or error
}

// BuildLogEntry is one line of a build's log.
type BuildLogEntry struct {
	Time    time.Time
	Level   string // debug, info, warn, error
	Step    string // "base", "1"…, "finalize"; "" for the build as a whole
	Message string
}

// Tag points a template's tag at one of its builds.
type Tag struct {
	TemplateID string
	Tag        string
	BuildID    string
	CreatedAt  time.Time
	// SnapshotOf, given to SetTag, says the tag completes a snapshot of
	// that sandbox: its checkpointed event is written with the tag. It
	// is not stored (always "" when read).
	SnapshotOf string
}

// TemplateStore persists templates, their builds, build logs and tags.
type TemplateStore interface {
	// CreateTemplate fails with ErrConflict if the ID or one of the
	// names is taken in the template's team.
	CreateTemplate(ctx context.Context, t Template) error
	GetTemplate(ctx context.Context, id string) (Template, error)
	// TemplateByName finds team's template that has name among its
	// Names. An empty teamID finds nothing.
	TemplateByName(ctx context.Context, teamID, name string) (Template, error)
	// ListTemplates lists a team's templates, oldest first.
	ListTemplates(ctx context.Context, teamID string) ([]Template, error)
	// UpdateTemplate reads, changes and writes a template atomically;
	// a name taken by another template of its team fails with
	// ErrConflict.
	UpdateTemplate(ctx context.Context, id string, update func(*Template) error) (Template, error)
	// DeleteTemplate removes the template with its names, builds, their
	// logs, and its tags.
	DeleteTemplate(ctx context.Context, id string) error
	// ListSnapshotTemplates lists a team's snapshot templates, newest
	// first. An empty TeamID is an error: it never means every team.
	ListSnapshotTemplates(ctx context.Context, f SnapshotFilter) ([]Template, error)

	CreateBuild(ctx context.Context, b Build) error
	GetBuild(ctx context.Context, id string) (Build, error)
	UpdateBuild(ctx context.Context, id string, update func(*Build) error) (Build, error)
	// ListBuilds lists a template's builds, oldest first.
	ListBuilds(ctx context.Context, templateID string) ([]Build, error)
	// BuildsByStatus lists builds in any of the statuses, on any template.
	BuildsByStatus(ctx context.Context, statuses ...BuildStatus) ([]Build, error)

	// AppendBuildLogs adds entries at the end of a build's log, in order.
	// A log holds at most MaxBuildLogEntries: entries past it are
	// dropped, with an error wrapping ErrLogFull.
	AppendBuildLogs(ctx context.Context, buildID string, entries ...BuildLogEntry) error
	// BuildLogs returns up to limit entries of a build's log from index
	// offset on. With minLevel set, only entries of that level or a more
	// severe one count (debug < info < warn < error), and offset indexes
	// that filtered sequence.
	BuildLogs(ctx context.Context, buildID string, offset, limit int, minLevel string) ([]BuildLogEntry, error)

	// SetTag points a tag at a build, creating or moving it.
	SetTag(ctx context.Context, t Tag) error
	GetTag(ctx context.Context, templateID, tag string) (Tag, error)
	// DeleteTag fails with ErrNotFound if the template has no such tag.
	DeleteTag(ctx context.Context, templateID, tag string) error
	// ListTags lists a template's tags, by name.
	ListTags(ctx context.Context, templateID string) ([]Tag, error)
}
