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
// then running; a running sandbox can be paused (frozen in place) and
// resumed; kill ends it. Kill and pause also end at once every exchange
// the proxy carries to the sandbox (it registers them with Track;
// endTraffic ends them), so that no stream outlives a sandbox that no
// longer answers. Each transition is written to the store before the
// runtime acts, so that a warren restarted after a crash can tell
// what it left: Start adopts the running and paused sandboxes the store
// knows on this node and removes everything else (half-made sandboxes,
// containers, mounts and network slots nobody knows).
//
// Timeouts. Every sandbox has an end time (EndAt). Create sets it to
// start + timeout; SetTimeout moves it to now + timeout (shorter or
// longer); Refresh and Connect only move it later. A reaper kills each
// running sandbox whose end time has passed, or pauses it when it was
// created with autoPause. Paused sandboxes are removed once they have been
// paused longer than PausedRetention (the pause time is recorded).
//
// Warm pools. For the templates in Config.PoolTemplates the manager keeps
// PoolSize sandboxes started ahead of demand, with a private envd token
// and no store record. Create claims one when it can, and pushes the
// request's environment, the sandbox's identity and its new access token
// into it through envd's /init; the pool refills in the background. A
// claimed sandbox is indistinguishable from a cold one, except that it
// started earlier (StartedAt is the claim time).
//
// Capacity. MaxSandboxes bounds all sandboxes of this node, warm ones
// included (ErrNoCapacity, which the API maps to 503); MaxPerTeam bounds a
// team's sandboxes (ErrTeamLimit, 429). Admission also counts nominal
// resources: the CPUs and memory of live, starting and warm sandboxes may
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
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/hostres"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/store"
)

// Errors, matched with errors.Is; the API maps them to statuses.
var (
	ErrNotFound         = errors.New("sandbox not found")
	ErrTemplateNotFound = errors.New("template not found")
	ErrInvalid          = errors.New("invalid request")
	ErrNoCapacity       = errors.New("no capacity")
	ErrTeamLimit        = errors.New("team sandbox limit reached")
	ErrConflict         = errors.New("sandbox is changing state")
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
	// MaxSandboxes bounds the sandboxes on this node, warm ones included.
	// Default 100.
	MaxSandboxes int
	// MaxPerTeam bounds one team's sandboxes; 0: no limit.
	MaxPerTeam int
	// PoolSize is the number of warm sandboxes kept per template in
	// PoolTemplates; 0 disables warm pools.
	PoolSize int
	// PoolTemplates are the templates that get a warm pool. Default
	// ["base"].
	PoolTemplates []string
	// ReapInterval is how often expired sandboxes are looked for.
	// Default 1s.
	ReapInterval time.Duration
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
	// Resolve finds the template a create names (an ID, a name, a
	// name:tag...). Default: the image store's template of that ID.
	Resolve func(ctx context.Context, teamID, ref string) (Template, error)
	// Observer, if set, is told of every create, pause and resume.
	Observer Observer
	Logger   *slog.Logger
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
}

// Manager runs sandboxes on one node. Its methods are safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	live     map[string]*live // running and paused sandboxes, by ID
	starting usage            // creates in flight (capacity is counted with them)
	perTeam  map[string]int   // live and starting sandboxes per team
	pools    map[string]*pool
	closed   bool

	stop chan struct{}
	wg   sync.WaitGroup
	// warmTransport carries warm-up requests; no connection is kept, so
	// none outlives a warm sandbox that is discarded.
	warmTransport *http.Transport
}

// live is a sandbox of this node, with what serving it needs in memory.
type live struct {
	// mu serialises lifecycle operations (kill, pause, resume) on it.
	mu        sync.Mutex
	id        string
	teamID    string
	inst      *node.Instance
	transport *http.Transport
	// Copied from the record for the proxy; guarded by Manager.mu.
	paused       bool
	pausedAt     time.Time
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
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = time.Second
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
		stop:          make(chan struct{}),
		warmTransport: &http.Transport{DisableKeepAlives: true},
	}, nil
}

// Start reconciles the store with the node (see the package doc), then
// starts the reaper and the warm pools.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.recover(ctx); err != nil {
		return err
	}
	m.wg.Add(2)
	go m.every(m.cfg.ReapInterval, m.reap)
	go m.every(sampleInterval, m.sampleRunning)
	if m.cfg.PoolSize > 0 {
		for _, t := range m.cfg.PoolTemplates {
			p := &pool{m: m, templateID: t, size: m.cfg.PoolSize, ready: make(chan *warm, m.cfg.PoolSize), kick: make(chan struct{}, 1)}
			m.pools[t] = p
			m.wg.Add(1)
			go p.fill()
		}
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

// recover adopts what the store says runs here and removes the rest.
func (m *Manager) recover(ctx context.Context) error {
	recs, err := m.cfg.Store.ListSandboxes(ctx, store.SandboxFilter{Node: m.cfg.NodeName})
	if err != nil {
		return fmt.Errorf("sandbox: listing sandboxes: %w", err)
	}
	keep := map[string]string{}
	for _, r := range recs {
		if r.State == store.StateRunning || r.State == store.StatePaused {
			keep[r.ID] = r.Slot
		}
	}
	if err := m.cfg.Node.Cleanup(ctx, keep); err != nil {
		m.log.Warn("cleanup of leftovers was incomplete", "err", err)
	}
	for _, r := range recs {
		if _, ok := keep[r.ID]; !ok {
			// Creating (interrupted) or killed (its resources are gone now).
			m.forget(ctx, r.ID)
			continue
		}
		inst, err := m.cfg.Node.Adopt(ctx, r.ID, r.Slot)
		if err != nil {
			m.log.Warn("sandbox did not survive the restart", "sandbox", r.ID, "err", err)
			if inst != nil {
				_ = m.cfg.Node.Delete(ctx, inst)
			}
			m.forget(ctx, r.ID)
			continue
		}
		l := m.newLive(r, inst)
		m.mu.Lock()
		m.live[r.ID] = l
		m.perTeam[r.TeamID]++
		m.mu.Unlock()
		m.log.Info("adopted sandbox", "sandbox", r.ID, "state", r.State)
	}
	return nil
}

func (m *Manager) forget(ctx context.Context, id string) {
	if err := m.cfg.Store.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.log.Warn("removing sandbox record", "sandbox", id, "err", err)
	}
}

func (m *Manager) newLive(r store.Sandbox, inst *node.Instance) *live {
	ex := ParseExtra(r.Extra)
	l := &live{
		id: r.ID, teamID: r.TeamID, inst: inst, transport: proxy.NewTransport(),
		paused: r.State == store.StatePaused, pausedAt: r.PausedAt, autoResume: r.AutoResume,
		envdToken: r.EnvdAccessToken, cpuCount: r.CPUCount, memoryMB: r.MemoryMB, startedAt: r.StartedAt,
	}
	if l.paused && l.pausedAt.IsZero() {
		// Paused before pause times were recorded: its retention starts now.
		l.pausedAt = time.Now()
	}
	if ex.Network != nil {
		if ex.Network.AllowPublicTraffic != nil && !*ex.Network.AllowPublicTraffic {
			l.trafficToken = r.TrafficAccessToken
		}
		l.maskHost = ex.Network.MaskRequestHost
	}
	return l
}

// CreateRequest is what a new sandbox needs.
type CreateRequest struct {
	TeamID     string
	TemplateID string
	Timeout    time.Duration
	Metadata   map[string]string
	EnvVars    map[string]string
	AutoPause  bool
	AutoResume bool
	Secure     bool
	// AllowInternetAccess is nil when the request did not say.
	AllowInternetAccess *bool
	Extra               Extra
}

// Create starts a sandbox, from the template's warm pool when it has one
// ready, and returns its record.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (_ store.Sandbox, err error) {
	defer m.observe(OpCreate, time.Now(), &err)
	if err := validateCreate(req); err != nil {
		return store.Sandbox{}, err
	}
	resolved, err := m.cfg.Resolve(ctx, req.TeamID, req.TemplateID)
	if err != nil {
		return store.Sandbox{}, err
	}
	tmpl := resolved.Image
	res := m.cfg.Resources
	if resolved.CPUCount > 0 {
		res.CPUCount = resolved.CPUCount
	}
	if resolved.MemoryMB > 0 {
		res.MemoryMB = resolved.MemoryMB
	}
	if err := m.withinNode(res); err != nil {
		return store.Sandbox{}, err
	}
	full, err := m.reserve(req.TeamID, res)
	if err != nil {
		return store.Sandbox{}, err
	}
	reserved := true
	defer func() {
		if reserved {
			m.unreserve(req.TeamID, res)
		}
	}()
	now := time.Now()
	rec := store.Sandbox{
		TeamID: req.TeamID, TemplateID: resolved.ID, Alias: resolved.Alias, State: store.StateCreating,
		StartedAt: now, EndAt: now.Add(req.Timeout),
		CPUCount: res.CPUCount, MemoryMB: res.MemoryMB, DiskSizeMB: res.DiskSizeMB,
		EnvdVersion: envdinfo.Version, EnvdAccessToken: newToken(), TrafficAccessToken: newToken(),
		Metadata: req.Metadata, EnvVars: req.EnvVars, AllowInternetAccess: req.AllowInternetAccess,
		AutoPause: req.AutoPause, AutoResume: req.AutoResume, Secure: true,
		Node: m.cfg.NodeName, Runtime: m.cfg.Node.Runtime().Name(), Extra: req.Extra.String(),
	}

	var inst *node.Instance
	var token string // envd's token until /init replaces it
	if w := m.claimWarm(tmpl); w != nil {
		inst, token = w.inst, w.token
	} else if full != nil {
		return store.Sandbox{}, full
	} else {
		rec.ID = NewID()
		token = rec.EnvdAccessToken
	}
	if inst != nil {
		rec.ID = inst.ID
	}
	// The record comes first: a crash from here on leaves a "creating"
	// record that tells the next start what to remove.
	if err := m.cfg.Store.CreateSandbox(ctx, rec); err != nil {
		if inst != nil {
			m.discard(inst)
		}
		return store.Sandbox{}, fmt.Errorf("sandbox: recording %s: %w", rec.ID, err)
	}
	fail := func(err error) (store.Sandbox, error) {
		if inst != nil {
			m.discard(inst)
		}
		m.forget(context.WithoutCancel(ctx), rec.ID)
		return store.Sandbox{}, err
	}
	if inst == nil {
		layers, err := m.cfg.Images.LayerDirs(tmpl)
		if err != nil {
			return fail(fmt.Errorf("sandbox: template %s: %w", tmpl.ID, err))
		}
		nreq := node.CreateRequest{
			ID: rec.ID, Layers: layers, CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB, DiskSizeMB: rec.DiskSizeMB,
			AccessToken: token, User: tmpl.User, Workdir: tmpl.Workdir,
		}
		if tmpl.Snapshot != "" {
			// Restored with its start command running. The envd in the
			// snapshot has the build's token; /init gives it this sandbox's.
			token = tmpl.SnapshotToken
			nreq.AccessToken = token
			inst, err = m.cfg.Node.Restore(ctx, nreq, m.cfg.Images.SnapshotDir(tmpl.Snapshot))
		} else {
			inst, err = m.cfg.Node.Create(ctx, nreq)
		}
		if err != nil {
			return fail(fmt.Errorf("sandbox: starting %s: %w", rec.ID, err))
		}
	}
	l := m.newLive(rec, inst)
	if err := initEnvd(ctx, l, token, rec, tmpl); err != nil {
		return fail(err)
	}
	started := time.Now()
	rec, err = m.cfg.Store.UpdateSandbox(ctx, rec.ID, func(s *store.Sandbox) error {
		s.State = store.StateRunning
		s.Slot = inst.Slot.Name
		// The clock starts when the sandbox is usable.
		s.StartedAt = started
		s.EndAt = started.Add(req.Timeout)
		return nil
	})
	if err != nil {
		return fail(fmt.Errorf("sandbox: recording %s: %w", rec.ID, err))
	}
	m.mu.Lock()
	m.live[rec.ID] = l
	m.starting.add(res, -1)
	m.mu.Unlock()
	reserved = false // the team count now belongs to the live sandbox
	return rec, nil
}

func validateCreate(req CreateRequest) error {
	if req.TemplateID == "" {
		return fmt.Errorf("%w: templateID is required", ErrInvalid)
	}
	if req.Timeout < 0 {
		return fmt.Errorf("%w: timeout must not be negative", ErrInvalid)
	}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		return fmt.Errorf("%w: allow_internet_access=false is not supported yet: egress policies are not implemented, and Warren does not pretend to enforce one", ErrInvalid)
	}
	if n := req.Extra.Network; n != nil && (len(n.AllowOut) > 0 || len(n.DenyOut) > 0) {
		return fmt.Errorf("%w: network.allowOut/denyOut are not supported yet: egress policies are not implemented", ErrInvalid)
	}
	if len(req.Extra.VolumeMounts) > 0 {
		return fmt.Errorf("%w: volume mounts are not supported yet", ErrInvalid)
	}
	return nil
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

// usedLocked adds up the sandboxes holding resources: live (running and
// paused), being created, warm and being warmed.
func (m *Manager) usedLocked() usage {
	u := m.starting
	for _, l := range m.live {
		u.add(Resources{CPUCount: l.cpuCount, MemoryMB: l.memoryMB}, 1)
	}
	for _, p := range m.pools {
		u.add(m.cfg.Resources, p.count())
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

// initEnvd pushes the sandbox's identity, environment and final access
// token into envd, authenticating with the token envd has now.
func initEnvd(ctx context.Context, l *live, token string, rec store.Sandbox, tmpl *image.Template) error {
	envs := map[string]string{}
	for k, v := range tmpl.Envs {
		envs[k] = v
	}
	envs["E2B_SANDBOX"] = "true"
	envs["E2B_SANDBOX_ID"] = rec.ID
	envs["E2B_TEMPLATE_ID"] = rec.TemplateID
	envs["E2B_TEAM_ID"] = rec.TeamID
	for k, v := range rec.EnvVars {
		envs[k] = v
	}
	body, _ := json.Marshal(map[string]any{
		"envVars":     envs,
		"accessToken": rec.EnvdAccessToken,
		"timestamp":   time.Now().UTC(),
	})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.inst.EnvdURL()+"/init", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", token)
	res, err := l.transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("sandbox: initialising envd of %s: %w", rec.ID, err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent && res.StatusCode != http.StatusOK {
		return fmt.Errorf("sandbox: initialising envd of %s: %s", rec.ID, res.Status)
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

// Get returns a team's sandbox. Killed sandboxes are not found.
func (m *Manager) Get(ctx context.Context, teamID, id string) (store.Sandbox, error) {
	rec, err := m.cfg.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (rec.TeamID != teamID || !visible(rec.State))) {
		return store.Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return rec, err
}

func visible(s store.SandboxState) bool {
	return s == store.StateRunning || s == store.StatePaused
}

// List returns a team's sandboxes matching f (whose TeamID it sets).
func (m *Manager) List(ctx context.Context, teamID string, f store.SandboxFilter) ([]store.Sandbox, error) {
	f.TeamID = teamID
	if len(f.States) == 0 {
		f.States = []store.SandboxState{store.StateRunning, store.StatePaused}
	}
	return m.cfg.Store.ListSandboxes(ctx, f)
}

// lookup finds a team's live sandbox.
func (m *Manager) lookup(teamID, id string) (*live, error) {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l == nil || (teamID != "" && l.teamID != teamID) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return l, nil
}

// Kill ends a team's sandbox and removes it.
func (m *Manager) Kill(ctx context.Context, teamID, id string) error {
	l, err := m.lookup(teamID, id)
	if err != nil {
		return err
	}
	return m.kill(ctx, l)
}

func (m *Manager) kill(ctx context.Context, l *live) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return m.killLocked(ctx, l)
}

// killLocked is kill with l.mu held.
func (m *Manager) killLocked(ctx context.Context, l *live) error {
	m.mu.Lock()
	if m.live[l.id] != l {
		m.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrNotFound, l.id) // killed meanwhile
	}
	delete(m.live, l.id)
	m.perTeam[l.teamID]--
	if m.perTeam[l.teamID] <= 0 {
		delete(m.perTeam, l.teamID)
	}
	m.mu.Unlock()
	// Before anything is taken apart: its streams end now, not when
	// their clients give up on a sandbox that no longer answers.
	m.endTraffic(l)
	ctx = context.WithoutCancel(ctx) // a client hanging up must not leave it half-removed
	if err := m.setState(ctx, l.id, store.StateKilled, time.Time{}); err != nil {
		m.log.Warn("recording kill", "sandbox", l.id, "err", err)
	}
	l.transport.CloseIdleConnections()
	if err := m.cfg.Node.Delete(ctx, l.inst); err != nil {
		// The record stays "killed": the next start removes what is left.
		return fmt.Errorf("sandbox: removing %s: %w", l.id, err)
	}
	l.transport.CloseIdleConnections()
	m.forget(ctx, l.id)
	return nil
}

// SetTimeout makes the sandbox expire timeout from now.
func (m *Manager) SetTimeout(ctx context.Context, teamID, id string, timeout time.Duration) error {
	if timeout < 0 {
		return fmt.Errorf("%w: timeout must not be negative", ErrInvalid)
	}
	return m.moveEnd(ctx, teamID, id, func(end time.Time) time.Time { return time.Now().Add(timeout) })
}

// Refresh makes the sandbox live at least d longer from now.
func (m *Manager) Refresh(ctx context.Context, teamID, id string, d time.Duration) error {
	return m.moveEnd(ctx, teamID, id, func(end time.Time) time.Time { return later(end, time.Now().Add(d)) })
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (m *Manager) moveEnd(ctx context.Context, teamID, id string, move func(time.Time) time.Time) error {
	if _, err := m.lookup(teamID, id); err != nil {
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

// Connect returns a running sandbox, resuming it if paused, and makes it
// live at least timeout longer. resumed tells whether it was paused.
func (m *Manager) Connect(ctx context.Context, teamID, id string, timeout time.Duration) (rec store.Sandbox, resumed bool, err error) {
	l, err := m.lookup(teamID, id)
	if err != nil {
		return store.Sandbox{}, false, err
	}
	if resumed, err = m.resume(ctx, l); err != nil {
		return store.Sandbox{}, false, err
	}
	rec, err = m.cfg.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		if !visible(s.State) {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		s.EndAt = later(s.EndAt, time.Now().Add(timeout))
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return rec, resumed, err
}

// Pause freezes a running sandbox in place. It reports false if the
// sandbox was already paused.
func (m *Manager) Pause(ctx context.Context, teamID, id string) (bool, error) {
	l, err := m.lookup(teamID, id)
	if err != nil {
		return false, err
	}
	return m.pause(ctx, l)
}

func (m *Manager) pause(ctx context.Context, l *live) (_ bool, err error) {
	defer m.observe(OpPause, time.Now(), &err)
	l.mu.Lock()
	defer l.mu.Unlock()
	paused, err := m.pausedNow(l)
	if err != nil {
		return false, err
	}
	if paused {
		return false, nil
	}
	pausedAt := time.Now()
	if err := m.setState(ctx, l.id, store.StatePaused, pausedAt); err != nil {
		return false, err
	}
	if err := m.cfg.Node.Pause(ctx, l.inst); err != nil {
		m.restoreState(ctx, l.id, store.StateRunning, time.Time{})
		return false, fmt.Errorf("sandbox: pausing %s: %w", l.id, err)
	}
	l.transport.CloseIdleConnections()
	m.mu.Lock()
	l.paused, l.pausedAt = true, pausedAt
	m.mu.Unlock()
	m.endTraffic(l)
	return true, nil
}

// resume thaws a paused sandbox; it reports whether it was paused. Like
// every transition, it is recorded before the runtime acts, and undone in
// the record if the runtime fails.
func (m *Manager) resume(ctx context.Context, l *live) (_ bool, err error) {
	defer m.observe(OpResume, time.Now(), &err)
	l.mu.Lock()
	defer l.mu.Unlock()
	paused, err := m.pausedNow(l)
	if err != nil {
		return false, err
	}
	if !paused {
		return false, nil
	}
	m.mu.Lock()
	pausedAt := l.pausedAt
	m.mu.Unlock()
	if err := m.setState(ctx, l.id, store.StateRunning, time.Time{}); err != nil {
		return false, err
	}
	if err := m.cfg.Node.Resume(ctx, l.inst); err != nil {
		m.restoreState(ctx, l.id, store.StatePaused, pausedAt)
		return false, fmt.Errorf("sandbox: resuming %s: %w", l.id, err)
	}
	m.mu.Lock()
	l.paused, l.pausedAt = false, time.Time{}
	m.mu.Unlock()
	return true, nil
}

// pausedNow reports whether a live sandbox is paused, or ErrNotFound if
// it was killed meanwhile. The caller holds l.mu.
func (m *Manager) pausedNow(l *live) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live[l.id] != l {
		return false, fmt.Errorf("%w: %s", ErrNotFound, l.id)
	}
	return l.paused, nil
}

// setState records a sandbox's state and when it was paused (zero
// unless st is paused).
func (m *Manager) setState(ctx context.Context, id string, st store.SandboxState, pausedAt time.Time) error {
	_, err := m.cfg.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		s.State = st
		s.PausedAt = pausedAt
		return nil
	})
	return err
}

// restoreState puts back the record of a transition the runtime failed,
// whatever the caller's context.
func (m *Manager) restoreState(ctx context.Context, id string, st store.SandboxState, pausedAt time.Time) {
	if err := m.setState(context.WithoutCancel(ctx), id, st, pausedAt); err != nil {
		m.log.Error("restoring a sandbox's record after a failed transition", "sandbox", id, "state", st, "err", err)
	}
}

// Resolve implements proxy.Resolver: it finds a live sandbox for sandbox
// traffic without changing it. A paused sandbox is found only when it was
// created with autoResume; the proxy then calls Resume, after it has
// checked the request's token.
func (m *Manager) Resolve(ctx context.Context, id string) (proxy.Target, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[id]
	if l == nil || (l.paused && !l.autoResume) {
		return proxy.Target{}, proxy.ErrNotFound
	}
	return proxy.Target{
		IP: l.inst.Slot.SandboxIP, Transport: l.transport, TrafficToken: l.trafficToken, MaskRequestHost: l.maskHost,
		EnvdAccessToken: l.envdToken, Paused: l.paused,
	}, nil
}

// Track implements proxy.Resolver: it registers an exchange the proxy
// carries to a running sandbox, which endTraffic ends.
func (m *Manager) Track(id string, end func()) (untrack func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[id]
	switch {
	case l == nil:
		return nil, proxy.ErrNotFound
	case l.paused:
		return nil, proxy.ErrTransitioning // paused since the proxy resolved it
	}
	if l.traffic == nil {
		l.traffic = map[uint64]func(){}
	}
	l.nextTraffic++
	key := l.nextTraffic
	l.traffic[key] = end
	return func() {
		m.mu.Lock()
		delete(l.traffic, key)
		m.mu.Unlock()
	}, nil
}

// endTraffic ends every exchange the proxy carries to l, at once: kill
// and pause call it once the sandbox is no longer running (gone from
// m.live, or marked paused), so that no exchange registers after it.
func (m *Manager) endTraffic(l *live) {
	m.mu.Lock()
	ends := l.traffic
	l.traffic = nil
	m.mu.Unlock()
	for _, end := range ends {
		end()
	}
	if len(ends) > 0 {
		m.log.Debug("ended the sandbox's proxied traffic", "sandbox", l.id, "exchanges", len(ends))
	}
}

// SignedBy implements proxy.Resolver: it offers the envd token of every
// sandbox Resolve finds to signed, all of them whatever the answers, and
// returns one for which it held. The work is bounded by the node's
// sandboxes (MaxSandboxes).
func (m *Manager) SignedBy(signed func(envdAccessToken string) bool) (string, error) {
	type candidate struct{ id, token string }
	m.mu.Lock()
	cands := make([]candidate, 0, len(m.live))
	for id, l := range m.live {
		if !l.paused || l.autoResume {
			cands = append(cands, candidate{id, l.envdToken})
		}
	}
	m.mu.Unlock()
	found := ""
	for _, c := range cands {
		if signed(c.token) && found == "" {
			found = c.id
		}
	}
	if found == "" {
		return "", proxy.ErrNotFound
	}
	return found, nil
}

// Resume implements proxy.Resolver: it resumes a paused autoResume
// sandbox for traffic that has shown its credentials.
func (m *Manager) Resume(ctx context.Context, id string) error {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l == nil || !l.autoResume {
		return proxy.ErrNotFound
	}
	if _, err := m.resume(ctx, l); err != nil {
		if errors.Is(err, ErrNotFound) {
			return proxy.ErrNotFound
		}
		return err
	}
	return nil
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

// reap kills (or pauses) expired sandboxes, and removes those paused for
// longer than the retention.
func (m *Manager) reap() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m.reapPaused(ctx)
	expired, err := m.cfg.Store.ExpiredSandboxes(ctx, time.Now())
	if err != nil {
		m.log.Warn("listing expired sandboxes", "err", err)
		return
	}
	for _, r := range expired {
		if r.Node != m.cfg.NodeName || r.State != store.StateRunning {
			continue // paused sandboxes stay until killed or resumed
		}
		l, err := m.lookup("", r.ID)
		if err != nil {
			continue
		}
		if r.AutoPause {
			_, err = m.pause(ctx, l)
		} else {
			err = m.kill(ctx, l)
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			m.log.Warn("ending an expired sandbox", "sandbox", r.ID, "err", err)
		} else {
			m.log.Info("sandbox timed out", "sandbox", r.ID, "paused", r.AutoPause)
		}
	}
}

// reapPaused removes the sandboxes paused for longer than the retention.
func (m *Manager) reapPaused(ctx context.Context) {
	cutoff := time.Now().Add(-m.cfg.PausedRetention)
	m.mu.Lock()
	var old []*live
	for _, l := range m.live {
		if l.paused && l.pausedAt.Before(cutoff) {
			old = append(old, l)
		}
	}
	m.mu.Unlock()
	for _, l := range old {
		l.mu.Lock()
		m.mu.Lock()
		still := m.live[l.id] == l && l.paused && l.pausedAt.Before(cutoff) // not resumed meanwhile
		pausedAt := l.pausedAt
		m.mu.Unlock()
		var err error
		if still {
			err = m.killLocked(ctx, l)
		}
		l.mu.Unlock()
		switch {
		case !still || errors.Is(err, ErrNotFound):
		case err != nil:
			m.log.Warn("removing a sandbox paused past the retention", "sandbox", l.id, "err", err)
		default:
			m.log.Info("removed a sandbox paused longer than the retention (--paused-retention)",
				"sandbox", l.id, "team", l.teamID, "paused_at", pausedAt, "retention", m.cfg.PausedRetention)
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
	Network      *Network      `json:"network,omitempty"`
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
	MCP          any           `json:"mcp,omitempty"`
}

// Network is a sandbox's network configuration as the API gives it.
type Network struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	MaskRequestHost    string   `json:"maskRequestHost,omitempty"`
}

// VolumeMount mounts a team volume into a sandbox.
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
