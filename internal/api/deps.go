package api

import (
	"context"
	"io"
	"time"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/template"
	"github.com/warren-sandbox/warren/internal/volume"
)

// Sandboxes is what the API needs of the sandbox manager
// (*sandbox.Manager); an interface so that the handlers can be tested and
// fuzzed without a node.
type Sandboxes interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (store.Sandbox, error)
	Get(ctx context.Context, teamID team.ID, id string) (store.Sandbox, error)
	List(ctx context.Context, teamID team.ID, f store.SandboxFilter) ([]store.Sandbox, error)
	Kill(ctx context.Context, teamID team.ID, id string) error
	SetTimeout(ctx context.Context, teamID team.ID, id string, timeout time.Duration) error
	Refresh(ctx context.Context, teamID team.ID, id string, d time.Duration) error
	Connect(ctx context.Context, teamID team.ID, id string, timeout time.Duration, memory bool) (store.Sandbox, bool, error)
	Pause(ctx context.Context, teamID team.ID, id string, keepMemory bool) (bool, error)
	ResumeSandbox(ctx context.Context, teamID team.ID, id string, opts sandbox.ResumeOptions) (store.Sandbox, error)
	Fork(ctx context.Context, teamID team.ID, id string, timeout time.Duration, count int) ([]sandbox.ForkResult, error)
	Metrics(ctx context.Context, teamID team.ID, id string, start, end time.Time) ([]sandbox.Metric, error)
	Logs(ctx context.Context, teamID team.ID, id string, start time.Time, limit int) ([]sandbox.LogEntry, error)
	UpdateNetwork(ctx context.Context, teamID team.ID, id string, u sandbox.NetworkUpdate) error
	NetworkLogs(ctx context.Context, teamID team.ID, id string, start time.Time, limit int) ([]egress.Entry, error)
}

// Templates is what the API needs of the template builder (*template.Builder).
type Templates interface {
	Create(ctx context.Context, req template.CreateRequest) (template.Created, error)
	FileStatus(ctx context.Context, teamID, templateID, hash, apiURL string) (present bool, uploadURL string, err error)
	Upload(ctx context.Context, templateID, hash, expires, signature string, body io.Reader) error
	StartBuild(ctx context.Context, teamID, templateID, buildID string, spec buildspec.Spec) error
	Status(ctx context.Context, teamID, templateID, buildID string, offset, limit int, minLevel string) (template.Status, error)
	Rebuild(ctx context.Context, teamID, templateID string, req template.RebuildRequest) (template.TemplateInfo, error)
	CreateFromDockerfile(ctx context.Context, teamID string, req template.RebuildRequest) (template.TemplateInfo, error)
	SetPublic(ctx context.Context, teamID, ref string, public bool) (store.Template, error)
	List(ctx context.Context, teamID string) ([]template.TemplateInfo, error)
	Get(ctx context.Context, teamID, ref string) (template.TemplateInfo, error)
	Delete(ctx context.Context, teamID, ref string) error
	Alias(ctx context.Context, teamID, name string) (store.Template, error)
	AssignTags(ctx context.Context, teamID, target string, tags []string) (string, []string, error)
	RemoveTags(ctx context.Context, teamID, name string, tags []string) error
	Tags(ctx context.Context, teamID, ref string) ([]store.Tag, error)
	CreateSnapshot(ctx context.Context, teamID, createdBy, sandboxID, name string) (template.SnapshotRef, error)
	ListSnapshots(ctx context.Context, teamID, sandboxID, name string, limit int, after *store.Cursor) ([]template.SnapshotRef, error)
}

// Volumes is what the API needs of the node's team volumes
// (*volume.Manager).
type Volumes interface {
	Create(ctx context.Context, teamID, name string) (store.Volume, error)
	Get(ctx context.Context, teamID, id string) (store.Volume, error)
	List(ctx context.Context, teamID string) ([]store.Volume, error)
	Delete(ctx context.Context, teamID, id string) error
	// Authenticate returns the volume token opens, if it is volume id's.
	Authenticate(ctx context.Context, id, token string) (store.Volume, error)
	// Tree opens a volume's files for the content API.
	Tree(v store.Volume) (*volume.Tree, error)
}

var (
	_ Sandboxes = (*sandbox.Manager)(nil)
	_ Templates = (*template.Builder)(nil)
	_ Volumes   = (*volume.Manager)(nil)
)

var _ Counter = (*sandbox.Manager)(nil)
