// Package sandbox is the sandbox manager: it owns the lifecycle of every
// sandbox on this node, between the API above it and the node's runtime,
// network and root filesystems below.
//
// Three things are called a sandbox; each package names its own. The
// manager's sandbox (live, and the Info it returns) is the lifecycle: an
// ID, a team, a state, timeouts, tokens. Its record in the store
// (store.Sandbox) is what survives a restart. Its node.Instance is what it
// occupies on this machine while it runs or is paused: a network slot, a
// root filesystem and a container, made by node.Create and released by
// node.Delete. The manager holds the instance; nothing below it knows of
// teams, timeouts or the store.
//
// Lifecycle. A sandbox is creating while its resources are being made,
// then running; a running sandbox can be paused and resumed; kill ends it.
// A paused sandbox is kept on disk (node.PauseToDisk): its memory
// checkpointed (or, without memory, only its files kept), its container,
// memory, CPU share and network slot released, so that it no longer
// counts against the node's capacity nor its team's. Resuming restores it
// into a fresh slot with its processes, tokens and settings (or boots it
// anew on its files). Kill and pause also end at once every exchange
// the proxy carries to the sandbox (it registers them with Track;
// endTraffic ends them), so that no stream outlives a sandbox that no
// longer answers. Each transition is written to the store before the
// runtime acts, so that a warren restarted after a crash (or a host
// reboot) can tell what it left: Start adopts the running sandboxes the
// store knows on this node, keeps the paused ones on disk, settles those a
// pause or resume was cut short for (recover.go), and removes everything
// else (half-made sandboxes, containers, mounts and network slots nobody
// knows). While it runs, a reconciler (reconcile.go) removes every running
// sandbox whose container died under it (its runtime process killed from
// the host, or out of memory), as a kill would. A running sandbox can
// also be snapshotted in place (a template
// of its team, internal/template) or forked into new sandboxes
// (snapshot.go).
//
// Timeouts. Every sandbox has an end time (EndAt). Create sets it to
// start + timeout; SetTimeout moves it to now + timeout (shorter or
// longer); Refresh and Connect only move it later. A resume starts a new
// term: now + the resume's timeout. A reaper kills each running sandbox
// whose end time has passed, or pauses it when it was created with
// autoPause. Paused sandboxes are removed, with their checkpoints, once
// they have been paused longer than PausedRetention (the pause time is
// recorded).
//
// Warm pools. Each template gets a pool of sandboxes started ahead of
// demand (booted over its layers with a private envd token, or restored
// from its start snapshot with the snapshot's token) and no store
// record, once it is created from (save those that always start cold:
// startsWarm); the templates in
// Config.PoolTemplates have one from the start, never smaller than
// PoolSize. A pool is sized from its template's recent create rate and
// its largest recent batch of creates, bounded by a memory budget
// (PoolMaxMemoryMB, shared fairly between the pools that want more of it
// than it holds) and the node's capacity,
// refilled by parallel starts, shrunk when the demand goes, and removed
// when unused or when their template is deleted (sizing.go,
// ForgetTemplate). Create claims a warm sandbox when one is ready
// (it never waits for one), and pushes the request's environment, the
// sandbox's identity and its new access token into it through envd's
// /init. A claimed sandbox is indistinguishable from a cold one, except
// that it started earlier (StartedAt is the claim time). Warm sandboxes
// hold no CPU while idle (a sandbox's CPUs are a CFS quota, a cap, not a
// reservation) but count for admission like running ones.
//
// Capacity. MaxSandboxes bounds the running sandboxes of this node, warm
// ones included (ErrNoCapacity, which the API maps to 503); MaxPerTeam
// bounds a team's running sandboxes (ErrTeamLimit, 429); paused ones count
// for neither, and a resume is admitted like a create. Admission also
// counts nominal resources: the CPUs and memory of running, starting and
// warm sandboxes may
// add up to the node's totals times CPUOvercommit and MemoryOvercommit,
// checked for every cold create and every warm sandbox the pools start
// (ErrNoCapacity naming the resource). A sandbox asking more CPUs or
// memory than the whole node has is ErrInvalid.
package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/hostres"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/volume"
)

// Errors, matched with errors.Is; the API maps them to statuses.
var (
	ErrNotFound         = errors.New("sandbox not found")
	ErrTemplateNotFound = errors.New("template not found")
	ErrInvalid          = errors.New("invalid request")
	ErrNoCapacity       = errors.New("no capacity")
	ErrTeamLimit        = errors.New("team sandbox limit reached")
	ErrConflict         = errors.New("sandbox is changing state")
	ErrVolumeNotFound   = errors.New("volume not found")
	// ErrDiskFull: the node's data disk is below its reserve
	// (--disk-reserve-mb). It comes with ErrNoCapacity (another node
	// may have room); the API answers it 507.
	ErrDiskFull = errors.New("disk full")
	// ErrNodeUnavailable: the node that runs the sandbox (in a cluster)
	// could not be asked now.
	ErrNodeUnavailable = errors.New("node unavailable")
)

// Resources are a sandbox's limits.
type Resources struct {
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
}

// DefaultResources are what a template that says nothing gets.
var DefaultResources = Resources{CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024}

// Defaults of Config's admission and retention fields.
const (
	// A sandbox's CPUs are a quota, not a reservation: idle sandboxes use
	// none, so CPUs are overcommitted far more than memory.
	DefaultCPUOvercommit    = 32
	DefaultMemoryOvercommit = 2
	DefaultPausedRetention  = 30 * 24 * time.Hour
)

// Config wires a Manager.
type Config struct {
	Store  store.Store
	Node   *node.Node
	Images *image.Store
	// NodeName names this node in sandbox records. Default "local".
	NodeName string
	// Blobs, if set, keeps every paused sandbox's files in a blob store
	// too, so that any node sharing the store resumes it (blobs.go);
	// BlobTemp is a directory of this node's data disk for the packs on
	// their way (required with Blobs).
	Blobs    blobstore.Store
	BlobTemp string
	// MaxTimeout bounds every term a sandbox is given (create, connect,
	// resume, fork, set timeout); default MaxTimeout (E2B's 24 h).
	MaxTimeout time.Duration
	// BlobCacheMB bounds what paused sandboxes stored in Blobs keep on
	// this node (least recently paused evicted first; they are fetched
	// back at their resume); 0: no bound.
	BlobCacheMB int
	// BlobGCGrace is how old a blob no record names must be before it is
	// removed (every 10 minutes). Default DefaultBlobGCGrace.
	BlobGCGrace time.Duration
	// NodeLostAfter is how old another node's heartbeat may be before its
	// sandboxes paused in Blobs are this node's to reap past the
	// retention (ReapLostPaused). Default cluster.DefaultLostAfter.
	NodeLostAfter time.Duration
	// MaxSandboxes bounds the sandboxes on this node, warm ones included.
	// Default 100.
	MaxSandboxes int
	// MaxPerTeam bounds one team's sandboxes; 0: no limit.
	MaxPerTeam int
	// PoolSize is the least number of warm sandboxes kept per template
	// in PoolTemplates, whatever the demand; 0 disables warm pools (of
	// every template).
	PoolSize int
	// PoolMaxMemoryMB bounds the memory the warm sandboxes of all pools
	// hold above their PoolSize floors, each counted at what its pool's
	// warm sandboxes were measured to hold once started (their limit
	// until then). Default a quarter of NodeMemoryMB.
	PoolMaxMemoryMB int
	// PoolTemplates are the templates that get a warm pool. Default
	// ["base"].
	PoolTemplates []string
	// ReapInterval is how often expired sandboxes are looked for.
	// Default 1s.
	ReapInterval time.Duration
	// ReconcileInterval is how often the runtime's containers are
	// compared with the running sandboxes (reconcile.go). Default
	// DefaultReconcileInterval.
	ReconcileInterval time.Duration
	// Resources are the limits of every sandbox whose template names
	// none. Default DefaultResources.
	Resources Resources
	// NodeCPUs and NodeMemoryMB are this node's totals. Default: read
	// from the host (hostres.Read).
	NodeCPUs, NodeMemoryMB int
	// CPUOvercommit and MemoryOvercommit bound the nominal CPUs and
	// memory of all sandboxes: at most the node's totals times these.
	// Defaults DefaultCPUOvercommit and DefaultMemoryOvercommit.
	CPUOvercommit, MemoryOvercommit float64
	// PausedRetention is how long a sandbox may stay paused before it is
	// removed. Default DefaultPausedRetention.
	PausedRetention time.Duration
	// DiskReserveMB and FreeDiskMB: a checkpoint (pause, snapshot, fork)
	// is refused (ErrNoCapacity) when the data dir's free space, less the
	// sandbox's memory (the checkpoint's most), would fall below the
	// reserve. A nil FreeDiskMB: no check.
	DiskReserveMB int64
	FreeDiskMB    func() (int64, error)
	// Resolve finds the template a create names (an ID, a name, a
	// name:tag...). Default: the image store's template of that ID.
	Resolve func(ctx context.Context, teamID, ref string) (Template, error)
	// Sealer keeps egressProxy passwords; nil: a create naming one fails.
	Sealer Sealer
	// CheckEgressProxy refuses an egressProxy address the node would
	// never dial (it resolves into a range the node refuses sandboxes).
	CheckEgressProxy func(ctx context.Context, address string) error
	// Audit is the egress audit log NetworkLogs reads; nil: none.
	Audit *egress.Audit
	// Volumes finds the team volumes sandboxes mount (*volume.Manager);
	// nil: creates with volume mounts are refused.
	Volumes Volumes
	// Admit, if set, may refuse every new sandbox of the node (a node
	// cordoned or drained by an operator, internal/cluster): its error
	// makes a create ErrNoCapacity. Resumes are not asked.
	Admit func(ctx context.Context) error
	// ReserveForTeam, if set, takes a place in a team's sandbox limit
	// beyond this node before a resume by proxy traffic, and returns what
	// gives it back once the resume has ended: a cluster's node claims it
	// in the shared store (dispatch.Claimer), as the api does for the
	// resumes, connects, forks and creates it sends. Its ErrTeamLimit
	// leaves the sandbox paused and the traffic answered 429.
	ReserveForTeam func(ctx context.Context, teamID string) (release func(), err error)
	// Observer, if set, is told of every create, pause and resume.
	Observer Observer
	Logger   *slog.Logger
}

// Volumes is what the manager needs of the node's team volumes.
type Volumes interface {
	// Resolve finds a team's volume by name (an error matching
	// volume.ErrNotFound if it has none).
	Resolve(ctx context.Context, teamID, name string) (store.Volume, error)
	// HostDir is where a volume's files are on this node, ready to be
	// bind-mounted.
	HostDir(ctx context.Context, volumeID string) (string, error)
}

// Template is what a create's templateID resolved to.
type Template struct {
	// ID and Alias are what the sandbox's record says.
	ID    string
	Alias string
	Image *image.Template
	// CPUCount and MemoryMB, if not 0, replace Config.Resources'.
	CPUCount int
	MemoryMB int
	// fork: Image is a fork's snapshot, restored only by that fork
	// (never through a warm pool).
	fork bool
}

// Manager runs sandboxes on one node. Its methods are safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger

	// adoptMu serialises takeovers of sandboxes paused on other nodes
	// (adoptFromBlob).
	adoptMu sync.Mutex

	mu       sync.Mutex
	live     map[string]*live // running and paused sandboxes, by ID
	starting usage            // creates in flight (capacity is counted with them)
	perTeam  map[string]int   // live and starting sandboxes per team
	pools    map[string]*pool
	closed   bool
	tuning   poolTuning // the pools' sizing policy (sizing.go)

	stop chan struct{}
	wg   sync.WaitGroup
	// trimAgain is set while a trim of the paused copies is scheduled
	// (trimCopies skipped a copy whose lock was held).
	trimAgain atomic.Bool
	// warmTransport carries warm-up requests; no connection is kept, so
	// none outlives a warm sandbox that is discarded.
	warmTransport *http.Transport
	// initCreated is initEnvd, for a created sandbox (tests slow it or
	// make it fail).
	initCreated func(ctx context.Context, inst *node.Instance, rt http.RoundTripper, token string, rec store.Sandbox, templateEnvs map[string]string) error
}

// live is a sandbox of this node, running or paused, with what serving it
// needs in memory.
type live struct {
	// mu serialises lifecycle operations (kill, pause, resume, snapshot)
	// on it.
	mu        sync.Mutex
	id        string
	teamID    string
	transport *http.Transport
	// Guarded by Manager.mu: inst is its resources while it runs (nil
	// while paused), parked where it is kept while paused.
	inst     *node.Instance
	parked   node.Paused
	paused   bool
	pausedAt time.Time
	// Copied from the record for the proxy; guarded by Manager.mu.
	autoResume   bool
	trafficToken string
	envdToken    string
	maskHost     string
	// traffic ends the exchanges the proxy carries to it (Track); guarded
	// by Manager.mu.
	traffic     map[uint64]func()
	nextTraffic uint64
	// Fixed for the sandbox's life; what its metrics are computed with.
	cpuCount, memoryMB int
	startedAt          time.Time
	metrics            sampler
	// pauseRetry is when the reaper may try again to pause it after an
	// autoPause failed (guarded by Manager.mu).
	pauseRetry time.Time
	// A created sandbox's envd /init runs after the create has answered
	// (see createFrom): initDone is closed when it has ended, and
	// cancelInit ends it early for a kill. Both are nil for a sandbox
	// that was ready when it became live (adopted, resumed); set before
	// it is, never changed.
	initDone   chan struct{}
	cancelInit context.CancelFunc
}

// initialised waits until the sandbox's envd has been initialised, or
// the attempt has ended in its removal.
func (l *live) initialised(ctx context.Context) error {
	if l.initDone == nil {
		return nil
	}
	select {
	case <-l.initDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// instance is the sandbox's node instance, nil while it is paused.
func (m *Manager) instance(l *live) *node.Instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	return l.inst
}

// New returns a manager. Call Start before using it.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Node == nil || cfg.Images == nil {
		return nil, errors.New("sandbox: Store, Node and Images are required")
	}
	if cfg.NodeName == "" {
		cfg.NodeName = "local"
	}
	if cfg.MaxSandboxes <= 0 {
		cfg.MaxSandboxes = 100
	}
	if cfg.NodeLostAfter <= 0 {
		cfg.NodeLostAfter = cluster.DefaultLostAfter
	}
	if cfg.BlobGCGrace <= 0 {
		cfg.BlobGCGrace = DefaultBlobGCGrace
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = DefaultReconcileInterval
	}
	if cfg.Resources == (Resources{}) {
		cfg.Resources = DefaultResources
	}
	if cfg.NodeCPUs <= 0 || cfg.NodeMemoryMB <= 0 {
		tot, err := hostres.Read()
		if err != nil {
			return nil, fmt.Errorf("sandbox: reading the node's CPUs and memory: %w", err)
		}
		if cfg.NodeCPUs <= 0 {
			cfg.NodeCPUs = tot.CPUs
		}
		if cfg.NodeMemoryMB <= 0 {
			cfg.NodeMemoryMB = tot.MemoryMB
		}
	}
	if cfg.CPUOvercommit <= 0 {
		cfg.CPUOvercommit = DefaultCPUOvercommit
	}
	if cfg.MemoryOvercommit <= 0 {
		cfg.MemoryOvercommit = DefaultMemoryOvercommit
	}
	if cfg.PausedRetention <= 0 {
		cfg.PausedRetention = DefaultPausedRetention
	}
	if cfg.PoolMaxMemoryMB <= 0 {
		cfg.PoolMaxMemoryMB = cfg.NodeMemoryMB / 4
	}
	if cfg.PoolTemplates == nil {
		cfg.PoolTemplates = []string{baseimage.TemplateID}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Resolve == nil {
		images := cfg.Images
		cfg.Resolve = func(_ context.Context, _, ref string) (Template, error) {
			t, err := images.Template(ref)
			if err != nil {
				return Template{}, fmt.Errorf("%w: %q", ErrTemplateNotFound, ref)
			}
			return Template{ID: t.ID, Alias: t.ID, Image: t}, nil
		}
	}
	return &Manager{
		cfg:           cfg,
		log:           cfg.Logger,
		live:          map[string]*live{},
		perTeam:       map[string]int{},
		pools:         map[string]*pool{},
		tuning:        defaultPoolTuning,
		stop:          make(chan struct{}),
		warmTransport: &http.Transport{DisableKeepAlives: true},
		initCreated:   initEnvd,
	}, nil
}

// Start reconciles the store with the node (see the package doc), then
// starts the reaper and the warm pools.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.recover(ctx); err != nil {
		return err
	}
	m.wg.Add(3)
	go m.every(m.cfg.ReapInterval, m.reap)
	go m.every(m.cfg.ReconcileInterval, m.reconcile)
	go m.every(sampleInterval, m.sampleRunning)
	if m.cfg.Blobs != nil {
		m.wg.Add(4)
		go func() {
			defer m.wg.Done()
			m.storeUnstored()
		}()
		go m.every(blobGCInterval, m.storeUnstored)
		go m.every(blobGCInterval, m.collectBlobs)
		go m.every(lostReapInterval, m.reapLostPaused)
	}
	if m.cfg.PoolSize > 0 {
		m.mu.Lock()
		for _, t := range m.cfg.PoolTemplates {
			m.newPoolLocked(t, m.cfg.PoolSize, m.cfg.Resources)
		}
		m.mu.Unlock()
	}
	return nil
}

// Close stops the reaper and the pools and removes the warm sandboxes.
// Running sandboxes are left running: a restarted manager adopts them.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	m.wg.Wait()
	var errs []error
	for _, p := range m.pools {
		errs = append(errs, p.drain())
	}
	return errors.Join(errs...)
}

func (m *Manager) forget(ctx context.Context, id string) {
	if err := m.cfg.Store.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.log.WarnContext(ctx, "removing sandbox record", "sandbox", id, "err", err)
	}
}

func validateCreate(req CreateRequest) error {
	if req.TeamID.IsZero() {
		return fmt.Errorf("%w: the sandbox's team is required", ErrInvalid)
	}
	if req.TemplateID == "" {
		return fmt.Errorf("%w: templateID is required", ErrInvalid)
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return err
	}
	if err := checkEnvVars(req.EnvVars); err != nil {
		return err
	}
	paths := make([]string, 0, len(req.VolumeMounts))
	for _, v := range req.VolumeMounts {
		paths = append(paths, v.Path)
	}
	if err := volume.CheckMountPaths(paths); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// resolveMounts finds the team's volumes a create names.
func (m *Manager) resolveMounts(ctx context.Context, teamID string, mounts []VolumeMount) ([]store.VolumeMount, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, fmt.Errorf("%w: this server keeps no volumes", ErrInvalid)
	}
	out := make([]store.VolumeMount, 0, len(mounts))
	for _, vm := range mounts {
		v, err := m.cfg.Volumes.Resolve(ctx, teamID, vm.Name)
		if errors.Is(err, volume.ErrNotFound) {
			return nil, fmt.Errorf("%w: the team has no volume named %q", ErrVolumeNotFound, vm.Name)
		}
		if err != nil {
			return nil, err
		}
		if v.TeamID != teamID { // never another team's, whoever found it
			return nil, fmt.Errorf("%w: the team has no volume named %q", ErrVolumeNotFound, vm.Name)
		}
		out = append(out, store.VolumeMount{VolumeID: v.ID, Name: v.Name, Path: vm.Path})
	}
	return out, nil
}

// createMounts are the volumes a sandbox of tmpl mounts: those the create
// names, or, for a snapshot of a sandbox that had volumes, the same volumes
// at the same paths (its checkpoint expects them; a create may repeat them
// but not name others).
func (m *Manager) createMounts(ctx context.Context, req CreateRequest, tmpl *image.Template) ([]store.VolumeMount, error) {
	if len(tmpl.SnapshotMounts) == 0 {
		return m.resolveMounts(ctx, req.TeamID.String(), req.VolumeMounts)
	}
	want := map[string]string{}
	for _, vm := range tmpl.SnapshotMounts {
		want[vm.Path] = vm.Name
	}
	for _, vm := range req.VolumeMounts {
		if want[vm.Path] != vm.Name || len(req.VolumeMounts) != len(want) {
			return nil, fmt.Errorf("%w: the snapshot's sandboxes mount the volumes it was taken with, at the same paths: give no volumeMounts", ErrInvalid)
		}
	}
	out := make([]store.VolumeMount, 0, len(tmpl.SnapshotMounts))
	for _, vm := range tmpl.SnapshotMounts {
		v, err := m.cfg.Store.GetVolume(ctx, req.TeamID.String(), vm.VolumeID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: volume %q, which the snapshot mounts, is gone", ErrVolumeNotFound, vm.Name)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, store.VolumeMount{VolumeID: v.ID, Name: v.Name, Path: vm.Path})
	}
	return out, nil
}

// volumeMounts are the mounts a record names, as a create asks for them.
func volumeMounts(rec store.Sandbox) []VolumeMount {
	var out []VolumeMount
	for _, vm := range rec.VolumeMounts {
		out = append(out, VolumeMount{Name: vm.Name, Path: vm.Path})
	}
	return out
}

// reserve counts a sandbox of res about to be created against the limits.
// When the node is full a warm sandbox can still be handed out, since that
// starts nothing new: full is then why a cold start is not possible.
func (m *Manager) reserve(teamID string, res Resources) (full, _ error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("%w: the server is shutting down", ErrNoCapacity)
	}
	if m.cfg.MaxPerTeam > 0 && m.perTeam[teamID] >= m.cfg.MaxPerTeam {
		return nil, fmt.Errorf("%w: the team has %d sandboxes, the most it may have at once; kill one first", ErrTeamLimit, m.perTeam[teamID])
	}
	if full = m.fitsLocked(res); full != nil && !m.anyWarmLocked() {
		return nil, full
	}
	m.perTeam[teamID]++
	m.starting.add(res, 1)
	return full, nil
}

func (m *Manager) unreserve(teamID string, res Resources) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.starting.add(res, -1)
	m.perTeam[teamID]--
	if m.perTeam[teamID] <= 0 {
		delete(m.perTeam, teamID)
	}
}

// usage is what sandboxes hold of the node, nominally.
type usage struct{ sandboxes, cpus, memoryMB int }

func (u *usage) add(r Resources, n int) {
	u.sandboxes += n
	u.cpus += n * r.CPUCount
	u.memoryMB += n * r.MemoryMB
}

// usedLocked adds up the sandboxes holding resources: running, being
// created or resumed, warm and being warmed. Paused ones hold none.
func (m *Manager) usedLocked() usage {
	u := m.starting
	for _, l := range m.live {
		if !l.paused {
			u.add(Resources{CPUCount: l.cpuCount, MemoryMB: l.memoryMB}, 1)
		}
	}
	for _, p := range m.pools {
		u.add(p.res, p.count())
	}
	return u
}

// fitsLocked says why one more sandbox of res does not fit on the node,
// or nil if it does.
func (m *Manager) fitsLocked(res Resources) error {
	u := m.usedLocked()
	if u.sandboxes >= m.cfg.MaxSandboxes {
		return fmt.Errorf("%w: this node runs %d sandboxes, its limit (--max-sandboxes); retry later", ErrNoCapacity, m.cfg.MaxSandboxes)
	}
	if limit := int(float64(m.cfg.NodeMemoryMB) * m.cfg.MemoryOvercommit); u.memoryMB+res.MemoryMB > limit {
		return fmt.Errorf("%w: not enough memory on this node: its sandboxes hold %d MB and this one asks %d MB, over the %d MB allowed (%d MB × --memory-overcommit %g); retry later",
			ErrNoCapacity, u.memoryMB, res.MemoryMB, limit, m.cfg.NodeMemoryMB, m.cfg.MemoryOvercommit)
	}
	if limit := int(float64(m.cfg.NodeCPUs) * m.cfg.CPUOvercommit); u.cpus+res.CPUCount > limit {
		return fmt.Errorf("%w: not enough CPU on this node: its sandboxes hold %d CPUs and this one asks %d, over the %d allowed (%d CPUs × --cpu-overcommit %g); retry later",
			ErrNoCapacity, u.cpus, res.CPUCount, limit, m.cfg.NodeCPUs, m.cfg.CPUOvercommit)
	}
	return nil
}

// withinNode refuses a sandbox asking more than the whole node has.
func (m *Manager) withinNode(res Resources) error {
	if res.CPUCount > m.cfg.NodeCPUs {
		return fmt.Errorf("%w: the template asks for %d CPUs, more than this node has (%d)", ErrInvalid, res.CPUCount, m.cfg.NodeCPUs)
	}
	if res.MemoryMB > m.cfg.NodeMemoryMB {
		return fmt.Errorf("%w: the template asks for %d MB of memory, more than this node has (%d MB)", ErrInvalid, res.MemoryMB, m.cfg.NodeMemoryMB)
	}
	return nil
}

func (m *Manager) anyWarmLocked() bool {
	for _, p := range m.pools {
		if len(p.ready) > 0 {
			return true
		}
	}
	return false
}

// initEnvd pushes the sandbox's identity, environment (the template's
// envs, then the sandbox's own) and final access token into envd, and
// sets its clock, authenticating with the token envd has now.
func initEnvd(ctx context.Context, inst *node.Instance, rt http.RoundTripper, token string, rec store.Sandbox, templateEnvs map[string]string) error {
	envs := map[string]string{}
	for k, v := range templateEnvs {
		envs[k] = v
	}
	envs["E2B_SANDBOX"] = "true"
	envs["E2B_SANDBOX_ID"] = rec.ID
	envs["E2B_TEMPLATE_ID"] = rec.TemplateID
	envs["E2B_TEAM_ID"] = rec.TeamID
	for k, v := range rec.EnvVars {
		envs[k] = v
	}
	return postInit(ctx, inst, rt, token, rec.ID, map[string]any{
		"envVars":     envs,
		"accessToken": rec.EnvdAccessToken,
		"timestamp":   time.Now().UTC(),
	})
}

// syncClock sets a resumed sandbox's clock, which stood still while it
// was paused.
func syncClock(ctx context.Context, inst *node.Instance, rt http.RoundTripper, rec store.Sandbox) error {
	return postInit(ctx, inst, rt, rec.EnvdAccessToken, rec.ID, map[string]any{"timestamp": time.Now().UTC()})
}

// initTimeout bounds envd's /init: it answers in milliseconds.
const initTimeout = 10 * time.Second

// postInit sends envd's POST /init.
func postInit(ctx context.Context, inst *node.Instance, rt http.RoundTripper, token, id string, body map[string]any) error {
	data, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, initTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, inst.EnvdURL()+"/init", bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", token)
	res, err := rt.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("sandbox: initialising envd of %s: %w", id, err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent && res.StatusCode != http.StatusOK {
		return fmt.Errorf("sandbox: initialising envd of %s: %s", id, res.Status)
	}
	return nil
}

// discard deletes a node sandbox that never became a live one.
func (m *Manager) discard(inst *node.Instance) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.cfg.Node.Delete(ctx, inst); err != nil {
		m.log.Error("removing a failed sandbox", "sandbox", inst.ID, "err", err)
	}
}

// Get returns a team's sandbox. Killed sandboxes are not found, nor is
// any for the zero team.ID.
func (m *Manager) Get(ctx context.Context, teamID team.ID, id string) (store.Sandbox, error) {
	scope := teamID.Scope()
	if scope.None() {
		return store.Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	rec, err := m.cfg.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (!scope.Covers(rec.TeamID) || !visible(rec.State))) {
		return store.Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return rec, err
}

func visible(s store.SandboxState) bool {
	return s == store.StateRunning || s == store.StatePaused
}

// List returns a team's sandboxes matching f (whose Teams it sets);
// none for the zero team.ID.
func (m *Manager) List(ctx context.Context, teamID team.ID, f store.SandboxFilter) ([]store.Sandbox, error) {
	f.Teams = teamID.Scope()
	if f.Teams.None() {
		return nil, nil
	}
	if len(f.States) == 0 {
		f.States = []store.SandboxState{store.StateRunning, store.StatePaused}
	}
	return m.cfg.Store.ListSandboxes(ctx, f)
}

// CountSandboxes is how many of a team's sandboxes List would return for f (its
// Limit and After aside), counted in the store; 0 for the zero team.ID.
func (m *Manager) CountSandboxes(ctx context.Context, teamID team.ID, f store.SandboxFilter) (int, error) {
	if teamID.IsZero() {
		return 0, nil
	}
	f.Teams = teamID.Scope()
	if len(f.States) == 0 {
		f.States = []store.SandboxState{store.StateRunning, store.StatePaused}
	}
	byNode, err := m.cfg.Store.CountSandboxes(ctx, f)
	total := 0
	for _, n := range byNode {
		total += n
	}
	return total, err
}

// lookup finds a live sandbox in scope: a team's (team.ID.Scope, where
// the zero ID matches none), or, for the manager's own work (the reaper,
// a drain), store.AllTeams().
func (m *Manager) lookup(scope store.TeamScope, id string) (*live, error) {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l == nil || !scope.Covers(l.teamID) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return l, nil
}

// SetTimeout makes the sandbox expire timeout from now.
func (m *Manager) SetTimeout(ctx context.Context, teamID team.ID, id string, timeout time.Duration) error {
	if err := checkTerm("timeout", timeout, m.maxTimeout()); err != nil {
		return err
	}
	return m.moveEnd(ctx, teamID, id, func(end time.Time) time.Time { return time.Now().Add(timeout) })
}

// Refresh makes the sandbox live at least d longer from now.
func (m *Manager) Refresh(ctx context.Context, teamID team.ID, id string, d time.Duration) error {
	if err := checkTerm("duration", d, MaxRefresh); err != nil {
		return err
	}
	return m.moveEnd(ctx, teamID, id, func(end time.Time) time.Time { return later(end, time.Now().Add(d)) })
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (m *Manager) moveEnd(ctx context.Context, teamID team.ID, id string, move func(time.Time) time.Time) error {
	if _, err := m.lookup(teamID.Scope(), id); err != nil {
		return err
	}
	_, err := m.cfg.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		if !visible(s.State) {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		s.EndAt = move(s.EndAt)
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return err
}

// every runs fn each interval until the manager stops.
func (m *Manager) every(interval time.Duration, fn func()) {
	defer m.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			fn()
		}
	}
}

// Count reports the live sandboxes and the warm ones.
func (m *Manager) Count() (live, warm int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.pools {
		warm += len(p.ready)
	}
	return len(m.live), warm
}

// NewID returns a new sandbox ID: 20 lower-case letters and digits, a
// single DNS label without '-', as host routing ({port}-{id}.{domain})
// needs.
func NewID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	// A leading letter keeps it a valid hostname label everywhere.
	b[0] = alphabet[int(b[0])%26]
	return string(b)
}

func newToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Extra is what a sandbox record keeps as JSON besides its columns.
type Extra struct {
	Network *Network `json:"network,omitempty"`
	MCP     any      `json:"mcp,omitempty"`
	IAM     *IAM     `json:"iam,omitempty"`
}

// IAM is a sandbox's workload identity (the create's iam): the tokens
// its egress rules may have the node mint, by name. It is fixed at
// create (E2B: a fork does not inherit it).
type IAM struct {
	Tokens map[string]IAMToken `json:"tokens,omitempty"`
}

// IAMToken is one named token: its audience, kept exactly as given, and
// its type (only identity.TokenType).
type IAMToken struct {
	Audience  string `json:"audience"`
	TokenType string `json:"tokenType"`
}

// audiences is the tokens' audiences by name, as egress.Config takes
// them.
func (i *IAM) audiences() map[string]string {
	if i == nil || len(i.Tokens) == 0 {
		return nil
	}
	m := make(map[string]string, len(i.Tokens))
	for name, t := range i.Tokens {
		m[name] = t.Audience
	}
	return m
}

// Network is a sandbox's network configuration as the API gives it.
type Network struct {
	AllowPublicTraffic *bool                    `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string                 `json:"allowOut,omitempty"`
	DenyOut            []string                 `json:"denyOut,omitempty"`
	MaskRequestHost    string                   `json:"maskRequestHost,omitempty"`
	Rules              map[string][]egress.Rule `json:"rules,omitempty"`
	EgressProxy        *EgressProxy             `json:"egressProxy,omitempty"`
}

// VolumeMount mounts a team volume, by name, at Path in a sandbox.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

func (e Extra) String() string {
	b, _ := json.Marshal(e)
	return string(b)
}

// ParseExtra reads a record's Extra; damaged JSON reads as empty.
func ParseExtra(s string) Extra {
	var e Extra
	if s != "" {
		_ = json.Unmarshal([]byte(s), &e)
	}
	return e
}
