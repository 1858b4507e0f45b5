// Package store persists Warren's control-plane state: teams, their API
// keys and access tokens, sandboxes, templates with their builds, build
// logs and tags, and team volumes.
//
// One implementation serves both databases through database/sql: SQLite
// (modernc.org/sqlite, pure Go, WAL) is the embedded default of a single
// box, PostgreSQL (pgx) the shared store of several nodes. The SQL is
// written once, with "?" placeholders rewritten for PostgreSQL, and the
// schema uses only types both understand (times are unix milliseconds,
// maps are JSON text).
//
// Every transition of a sandbox is written here before the runtime acts
// (see internal/sandbox), so that a restarted warren can reconcile the
// store with what is running.
//
// # Migrations
//
// The schema is built by the SQL files in migrations/, embedded in the
// binary and applied at Open by github.com/pressly/goose/v3, each file in
// its own transaction, recorded in goose_db_version. Several processes
// opening one database at once apply each migration once: they take
// PostgreSQL's advisory lock 7261, or on SQLite an flock on the file
// DB.migrate-lock beside the database. Databases migrated by the runner
// before goose (versions in schema_migrations) are adopted on first open;
// see prepareVersionTable.
//
// To add a migration:
//   - Name it migrations/NNNN_what_it_does.sql, NNNN the next version
//     (four digits, one more than the highest; never reuse or renumber).
//   - Start it with the line "-- +goose Up". There is no Down section:
//     migrations only go forward. A statement ends with ";" at the end of
//     a line; one with ";" inside it (a trigger, a PL/pgSQL body) goes
//     between "-- +goose StatementBegin" and "-- +goose StatementEnd".
//   - Write it once for both databases: the same file runs on SQLite and
//     PostgreSQL, so use only TEXT, INTEGER and BIGINT (times in unix ms,
//     booleans 0/1, maps as JSON text), give a column added with ALTER
//     TABLE ... ADD COLUMN ... NOT NULL a DEFAULT (SQLite requires one),
//     and rebuild a table rather than altering a constraint (SQLite
//     cannot). SQL that must differ between the two belongs in a Go
//     migration (goose.NewGoMigration) that checks the dialect, listed in
//     goMigrations (migrate.go) and numbered in the files' sequence: 0031,
//     the triggers keeping sandbox_counts (sandbox_counts.go), is one.
//   - Never edit a migration once it is on main: databases have run it.
//   - Run the store tests: TestFreshDatabaseGetsEveryMigration applies
//     every file on both databases and checks each is recorded.
package store

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned (wrapped) for a missing record.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned (wrapped) when a record with that ID exists.
var ErrConflict = errors.New("already exists")

// ErrLogFull is returned (wrapped) by AppendBuildLogs for entries past a
// build's MaxBuildLogEntries: they are dropped.
var ErrLogFull = errors.New("build log full")

// Team owns keys, sandboxes and templates.
type Team struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// KeyKind tells API keys (X-API-Key) from access tokens (Bearer).
type KeyKind string

const (
	KindAPIKey      KeyKind = "api_key"
	KindAccessToken KeyKind = "access_token"
)

// Key is an API key or access token. Only its hash is stored; Mask is a
// recognisable, harmless part of it for listings (prefix and last chars).
type Key struct {
	ID     string
	TeamID string
	Kind   KeyKind
	Name   string
	Hash   string
	Mask   string
	// ValueLength is the length of the secret after its kind's prefix
	// (40 for the keys Warren makes); 0 for keys stored before it was.
	ValueLength int
	CreatedAt   time.Time
}

// SandboxState is a sandbox's lifecycle state.
type SandboxState string

const (
	StateCreating SandboxState = "creating"
	StateRunning  SandboxState = "running"
	StatePaused   SandboxState = "paused"
	StateKilled   SandboxState = "killed"
)

// Sandbox is a sandbox's record.
type Sandbox struct {
	ID                  string
	TeamID              string
	TemplateID          string
	Alias               string
	State               SandboxState
	StartedAt           time.Time
	EndAt               time.Time
	CPUCount            int
	MemoryMB            int
	DiskSizeMB          int
	EnvdVersion         string
	EnvdAccessToken     string
	TrafficAccessToken  string
	Metadata            map[string]string
	EnvVars             map[string]string
	AllowInternetAccess *bool
	AutoPause           bool
	AutoResume          bool
	Secure              bool
	// Node and Slot say where the sandbox runs: the node's name and the
	// network slot's namespace name.
	Node    string
	Slot    string
	Runtime string
	// Extra holds fields the API passes through (network policy, volume
	// mounts...) as JSON.
	Extra     string
	UpdatedAt time.Time
	// PausedAt is when the sandbox was paused; zero unless it is paused.
	PausedAt time.Time
	// Image is what the sandbox's root filesystem and envd were made
	// from, as JSON the sandbox manager writes (layer IDs, user, workdir,
	// the template's environment): what resuming or forking it needs,
	// whatever happened to its template since.
	Image string
	// AutoPauseMemory says whether a pause on timeout keeps the memory
	// (true) or only the file system.
	AutoPauseMemory bool
	// RootfsDir and Checkpoint say where a paused sandbox is kept on its
	// node: the directory of its root filesystem (with its writable
	// layer's disk image) and the checkpoint image of its memory ("" when
	// it was paused without). Both are "" while it runs.
	RootfsDir  string
	Checkpoint string
	// PausedBlob is the blob (internal/blobstore, "sha256:...", of the
	// sandbox's team) holding a paused sandbox's kept files, so that any
	// node can resume it; "" when they are on its node only, or it runs.
	PausedBlob string
	// VolumeMounts are the team volumes the sandbox mounts. CreateSandbox
	// checks that each exists in the sandbox's team; they are meant to
	// stay as created (a volume is not deleted while they name it).
	VolumeMounts []VolumeMount
}

// TeamScope is whose sandboxes a listing covers: one team's (ForTeam) or
// every team's (AllTeams), never both. The zero TeamScope matches
// nothing, and so does ForTeam(""): a lookup without a team fails closed
// whichever way it came to lack one.
type TeamScope struct {
	team string
	all  bool
}

// ForTeam is team's sandboxes; an empty team matches nothing.
func ForTeam(team string) TeamScope { return TeamScope{team: team} }

// AllTeams is every team's sandboxes: for the server's own work over all
// of them (a node adopting its sandboxes at its start), never for a
// team's request.
func AllTeams() TeamScope { return TeamScope{all: true} }

// Team is the scope's one team: "" for all teams, or for none.
func (s TeamScope) Team() string { return s.team }

// All reports whether the scope is every team's.
func (s TeamScope) All() bool { return s.all }

// None reports whether the scope matches nothing.
func (s TeamScope) None() bool { return !s.all && s.team == "" }

// Covers reports whether a resource of team is in the scope: always for
// all teams, never for none, else when it is the scope's team.
func (s TeamScope) Covers(team string) bool {
	return s.all || (s.team != "" && team == s.team)
}

// SandboxFilter selects sandboxes for ListSandboxes.
type SandboxFilter struct {
	// Teams is whose sandboxes it keeps: ForTeam(id), or AllTeams(). Its
	// zero value, like ForTeam(""), matches nothing.
	Teams TeamScope
	// States, if set, keeps only sandboxes in one of them.
	States []SandboxState
	// Metadata keeps only sandboxes whose metadata has every pair.
	Metadata map[string]string
	// TemplateID, if set, keeps only sandboxes of that template.
	TemplateID string
	// Node, if set, keeps only sandboxes placed on that node.
	Node string
	// OnNodes, if not nil, keeps only sandboxes placed on one of these
	// nodes (none if it is empty): the api leaves out lost nodes' here,
	// so that a page holds Limit sandboxes.
	OnNodes []string
	// OrInBlobStore, with OnNodes, also keeps paused sandboxes whose kept
	// files are in the blob store (PausedBlob set), whatever their node:
	// those resume on any node.
	OrInBlobStore bool
	// StartedAfter, if set, keeps only sandboxes started at or after it.
	StartedAfter time.Time
	// After continues a listing: sandboxes ordered after this cursor.
	After *Cursor
	// Desc orders newest first (default oldest first).
	Desc bool
	// Limit bounds the result; 0 means no limit.
	Limit int
}

// Cursor is a position in a listing ordered by (StartedAt, ID).
type Cursor struct {
	StartedAt time.Time
	ID        string
}

// Store is the persistence interface. Implementations are safe for
// concurrent use.
type Store interface {
	CreateTeam(ctx context.Context, t Team) error
	GetTeam(ctx context.Context, id string) (Team, error)
	ListTeams(ctx context.Context) ([]Team, error)

	CreateKey(ctx context.Context, k Key) error
	// KeyByHash finds a key of the given kind by its hash.
	KeyByHash(ctx context.Context, kind KeyKind, hash string) (Key, error)
	// ListKeys lists a team's keys of both kinds, oldest first. An empty
	// teamID lists none.
	ListKeys(ctx context.Context, teamID string) ([]Key, error)
	// RenameKey renames one of team's keys; ErrNotFound for a key of
	// another team, or an empty teamID.
	RenameKey(ctx context.Context, teamID, id, name string) error
	// DeleteKey deletes one of team's keys; ErrNotFound for a key of
	// another team, or an empty teamID.
	DeleteKey(ctx context.Context, teamID, id string) error

	CreateSandbox(ctx context.Context, s Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// UpdateSandbox reads the sandbox, lets update change it and writes
	// it back, atomically: concurrent updates of one sandbox serialise.
	// An error from update aborts without writing.
	UpdateSandbox(ctx context.Context, id string, update func(*Sandbox) error) (Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error)
	// CountSandboxes counts the sandboxes f matches, by node, without
	// reading them (f's Limit and After do not apply). An empty team
	// matches nothing, as in ListSandboxes.
	CountSandboxes(ctx context.Context, f SandboxFilter) (map[string]int, error)
	// ExpiredSandboxes lists running or paused sandboxes whose EndAt has passed.
	ExpiredSandboxes(ctx context.Context, now time.Time) ([]Sandbox, error)

	TemplateStore
	SecretStore
	VolumeStore
	NodeStore
	ClaimStore
	RouteStore
	DiskUsageStore
	BuildBlobStore
	EventStore
	SnapshotBlobStore
	DashboardSessionStore

	Close() error
}
