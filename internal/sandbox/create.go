package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/steptrace"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/volume"
)

// CreateRequest is what a new sandbox needs.
type CreateRequest struct {
	TeamID     team.ID
	TemplateID string
	Timeout    time.Duration
	Metadata   map[string]string
	EnvVars    map[string]string
	AutoPause  bool
	// AutoPauseMemory is whether a pause on timeout keeps the memory;
	// nil: it does.
	AutoPauseMemory *bool
	AutoResume      bool
	Secure          bool
	// AllowInternetAccess is nil when the request did not say.
	AllowInternetAccess *bool
	// VolumeMounts mount team volumes, by name, into the sandbox.
	VolumeMounts []VolumeMount
	Extra        Extra
}

// imageInfo is what a sandbox's root filesystem and envd were made from,
// kept in its record (store.Sandbox.Image) so that resuming and forking it
// need nothing of its template, which may have been rebuilt or deleted
// since.
type imageInfo struct {
	// Layers are the image store's layer IDs, bottom first.
	Layers  []string          `json:"layers"`
	User    string            `json:"user,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	Envs    map[string]string `json:"envs,omitempty"`
}

func imageOf(t *image.Template) imageInfo {
	return imageInfo{Layers: t.Layers, User: t.User, Workdir: t.Workdir, Envs: t.Envs}
}

func (i imageInfo) String() string {
	b, _ := json.Marshal(i)
	return string(b)
}

func parseImage(rec store.Sandbox) (imageInfo, error) {
	var i imageInfo
	if err := json.Unmarshal([]byte(rec.Image), &i); err != nil || len(i.Layers) == 0 {
		return imageInfo{}, fmt.Errorf("sandbox: %s has no record of its image (%v)", rec.ID, err)
	}
	return i, nil
}

// nodeRequest is the one place that turns a sandbox's record into what the
// node makes it from: every sandbox that exists already (resumed, forked,
// created from a snapshot) is made from its record alone, so that
// whatever a record carries reaches the node the same way on every path.
func (m *Manager) nodeRequest(ctx context.Context, rec store.Sandbox) (node.CreateRequest, error) {
	img, err := parseImage(rec)
	if err != nil {
		return node.CreateRequest{}, err
	}
	layers, err := m.cfg.Images.LayerDirs(&image.Template{ID: rec.TemplateID, Layers: img.Layers})
	if err != nil {
		return node.CreateRequest{}, fmt.Errorf("sandbox: %s: %w", rec.ID, err)
	}
	eg, err := m.egressOf(rec)
	if err != nil {
		return node.CreateRequest{}, err
	}
	req := node.CreateRequest{
		ID: rec.ID, Layers: layers, CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB, DiskSizeMB: rec.DiskSizeMB,
		AccessToken: rec.EnvdAccessToken, User: img.User, Workdir: img.Workdir, Egress: eg,
	}
	for _, vm := range rec.VolumeMounts {
		if m.cfg.Volumes == nil {
			return node.CreateRequest{}, fmt.Errorf("sandbox: %s mounts volumes, and this server keeps none", rec.ID)
		}
		dir, err := m.cfg.Volumes.HostDir(ctx, vm.VolumeID)
		if errors.Is(err, volume.ErrNotFound) {
			return node.CreateRequest{}, fmt.Errorf("%w: volume %q (%s) is gone", ErrVolumeNotFound, vm.Name, vm.VolumeID)
		}
		if err != nil {
			return node.CreateRequest{}, fmt.Errorf("sandbox: volume %s of %s: %w", vm.VolumeID, rec.ID, err)
		}
		req.Mounts = append(req.Mounts, runtime.Mount{Source: dir, Destination: vm.Path})
	}
	return req, nil
}

// snapshotOf is where a sandbox of tmpl is restored from: its snapshot's
// directory ("" for a template booted over its layers) and, for a
// running sandbox's snapshot, the copy of its disk and that disk's size,
// which the new sandbox's disk has.
func (m *Manager) snapshotOf(tmpl *image.Template) (dir, diskImage string, diskMB int, err error) {
	if tmpl.Snapshot == "" {
		return "", "", 0, nil
	}
	dir = m.cfg.Images.SnapshotDir(tmpl.Snapshot)
	if !tmpl.SnapshotDisk {
		return dir, "", 0, nil
	}
	diskImage = filepath.Join(dir, node.SnapshotDiskName)
	if diskMB, err = rootfs.DiskSizeMB(diskImage); err != nil {
		return "", "", 0, fmt.Errorf("its snapshot's disk is gone: %v", err)
	}
	return dir, diskImage, diskMB, nil
}

// Create starts a sandbox, from the template's warm pool when it has one
// ready, and returns its record.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (_ store.Sandbox, err error) {
	defer m.observe(OpCreate, time.Now(), &err)
	// The steps' durations go to the debug log (make bench reads them).
	ctx = steptrace.With(ctx, steptrace.New())
	if err := m.validateCreate(req); err != nil {
		return store.Sandbox{}, err
	}
	pol, err := compileEgress(req.Extra.Network, req.Extra.IAM, req.TeamID.String(), req.AllowInternetAccess, m.cfg.Sealer)
	if err != nil {
		return store.Sandbox{}, err
	}
	if pol.NeedsProxy() && !m.cfg.Node.HasEgressProxy() {
		return store.Sandbox{}, fmt.Errorf("%w: this node runs no egress proxy: domains, rules and egressProxy cannot be enforced", ErrInvalid)
	}
	if err := m.checkUpstream(ctx, pol); err != nil {
		return store.Sandbox{}, err
	}
	if err := m.sealPassword(req.Extra.Network, req.TeamID.String()); err != nil {
		return store.Sandbox{}, err
	}
	resolved, err := m.cfg.Resolve(ctx, req.TeamID.String(), req.TemplateID)
	if err != nil {
		return store.Sandbox{}, err
	}
	return m.createFrom(ctx, req, resolved)
}

// createFrom creates a sandbox of a resolved template: booted over its
// layers, or restored from its snapshot (a build's, a sandbox's or a
// fork's). Its steps, in order: admit and size it, reserve its share of
// the limits, take a warm sandbox or a new ID, record it as creating,
// start it on the node, record it as running, and hand it over to the
// live set, whose envd /init runs while the answer goes back.
func (m *Manager) createFrom(ctx context.Context, req CreateRequest, resolved Template) (store.Sandbox, error) {
	mounts, plan, err := m.admitCreate(ctx, req, resolved)
	if err != nil {
		return store.Sandbox{}, err
	}
	full, err := m.reserve(req.TeamID.String(), plan.res)
	if err != nil {
		return store.Sandbox{}, err
	}
	reserved := true
	defer func() {
		if reserved {
			m.unreserve(req.TeamID.String(), plan.res)
		}
	}()
	rec := m.creatingRecord(req, resolved, plan.res, mounts)

	tr := steptrace.From(ctx) // nil (no marks) for a fork's children
	tr.Mark("admit")
	start, err := m.claimStart(resolved, plan, len(mounts), full)
	if err != nil {
		return store.Sandbox{}, err
	}
	rec.ID = start.id
	if start.warm == nil {
		start.token = rec.EnvdAccessToken
	}
	tr.Mark("claim")
	if err := m.recordCreating(ctx, rec, start.warm); err != nil {
		return store.Sandbox{}, err
	}
	tr.Mark("store-create")
	inst, token, err := m.startInstance(ctx, rec, plan, start)
	if err != nil {
		m.forget(context.WithoutCancel(ctx), rec.ID)
		return store.Sandbox{}, err
	}
	l := m.newLive(rec, inst)
	running, err := m.recordRunning(ctx, rec.ID, inst, req.Timeout)
	if err != nil {
		m.discard(inst)
		m.forget(context.WithoutCancel(ctx), rec.ID) // rec's ID: a failed update returns no record
		return store.Sandbox{}, err
	}
	rec = running
	tr.Mark("store-update")
	m.goLive(ctx, l, rec, inst, token, plan.res, plan.tmpl.Envs, start.warm != nil)
	reserved = false // the team count now belongs to the live sandbox
	return rec, nil
}

// createPlan is what a create starts its sandbox from and with.
type createPlan struct {
	tmpl *image.Template
	res  Resources
	// snapshotDir and diskImage: see snapshotOf.
	snapshotDir, diskImage string
}

// admitCreate decides whether a sandbox of resolved may be made here
// (admission, disk reserve, its volumes, the node's size) and of what
// size: the node's defaults, the template's own, and a snapshot's disk.
func (m *Manager) admitCreate(ctx context.Context, req CreateRequest, resolved Template) ([]store.VolumeMount, createPlan, error) {
	if m.cfg.Admit != nil { // forks come here too
		if err := m.cfg.Admit(ctx); err != nil {
			return nil, createPlan{}, fmt.Errorf("%w: %v", ErrNoCapacity, err)
		}
	}
	if err := m.createSpace(); err != nil {
		return nil, createPlan{}, err
	}
	mounts, err := m.createMounts(ctx, req, resolved.Image)
	if err != nil {
		return nil, createPlan{}, err
	}
	plan := createPlan{tmpl: resolved.Image, res: m.cfg.Resources}
	if resolved.CPUCount > 0 {
		plan.res.CPUCount = resolved.CPUCount
	}
	if resolved.MemoryMB > 0 {
		plan.res.MemoryMB = resolved.MemoryMB
	}
	var diskMB int
	plan.snapshotDir, plan.diskImage, diskMB, err = m.snapshotOf(plan.tmpl)
	if err != nil {
		return nil, createPlan{}, fmt.Errorf("%w: %s: %v", ErrTemplateNotFound, req.TemplateID, err)
	}
	if plan.diskImage != "" {
		plan.res.DiskSizeMB = diskMB
	}
	if err := m.withinNode(plan.res); err != nil {
		return nil, createPlan{}, err
	}
	return mounts, plan, nil
}

// creatingRecord is the new sandbox's record, as it is stored before
// anything starts (state creating, no ID yet).
func (m *Manager) creatingRecord(req CreateRequest, resolved Template, res Resources, mounts []store.VolumeMount) store.Sandbox {
	now := time.Now()
	return store.Sandbox{
		TeamID: req.TeamID.String(), TemplateID: resolved.ID, Alias: resolved.Alias, State: store.StateCreating,
		StartedAt: now, EndAt: now.Add(req.Timeout),
		CPUCount: res.CPUCount, MemoryMB: res.MemoryMB, DiskSizeMB: res.DiskSizeMB,
		EnvdVersion: envdinfo.Version, EnvdAccessToken: newToken(), TrafficAccessToken: newToken(),
		Metadata: req.Metadata, EnvVars: req.EnvVars, AllowInternetAccess: req.AllowInternetAccess,
		AutoPause: req.AutoPause, AutoPauseMemory: req.AutoPauseMemory == nil || *req.AutoPauseMemory,
		AutoResume: req.AutoResume, Secure: true,
		Node: m.cfg.NodeName, Runtime: m.cfg.Node.Runtime().Name(), Extra: req.Extra.String(),
		Image:        imageOf(resolved.Image).String(),
		VolumeMounts: mounts,
	}
}

// sandboxStart is where a new sandbox comes from: a warm one of its
// template's pool (warm, its ID and envd's current token), or a cold
// start under a new ID (warm nil; the token is the record's).
type sandboxStart struct {
	id    string
	warm  *node.Instance
	token string // envd's token until /init replaces it
}

// claimStart takes a warm sandbox of the plan's template when one fits,
// else a new ID; full (from reserve) is why a cold start may not fit,
// unless evicting warm sandboxes makes room.
func (m *Manager) claimStart(resolved Template, plan createPlan, mounts int, full error) (sandboxStart, error) {
	// A fork restores its snapshot cold: the snapshot is its own, gone
	// once the fork ends, and the pool of the parent's template (whose ID
	// its children carry) holds sandboxes of another image.
	if !resolved.fork && startsWarm(plan.tmpl, mounts) {
		if w := m.claimWarm(plan.tmpl, plan.res); w != nil {
			return sandboxStart{id: w.inst.ID, warm: w.inst, token: w.token}, nil
		}
	}
	if full != nil && !m.evictWarmFor(plan.res) {
		return sandboxStart{}, full
	}
	return sandboxStart{id: NewID()}, nil
}

// recordCreating stores the record first: a crash from here on leaves a
// "creating" record that tells the next start what to remove. A warm
// sandbox claimed for it goes when the record cannot be written.
func (m *Manager) recordCreating(ctx context.Context, rec store.Sandbox, warm *node.Instance) error {
	err := m.cfg.Store.CreateSandbox(ctx, rec)
	if err == nil {
		return nil
	}
	if warm != nil {
		m.discard(warm)
	}
	if errors.Is(err, store.ErrNotFound) {
		// A volume it mounts was deleted since it was resolved.
		return fmt.Errorf("%w: %v", ErrVolumeNotFound, err)
	}
	return fmt.Errorf("sandbox: recording %s: %w", rec.ID, err)
}

// startInstance makes the sandbox of rec run on the node: a warm one is
// brought to the foreground, else it is restored from the plan's
// snapshot or booted over its layers; then its egress policy goes on if
// it has none yet (a warm one). It returns the instance and envd's
// current token; on an error nothing of it is left on the node.
func (m *Manager) startInstance(ctx context.Context, rec store.Sandbox, plan createPlan, start sandboxStart) (*node.Instance, string, error) {
	inst, token := start.warm, start.token
	if inst != nil {
		if err := m.cfg.Node.Foreground(inst); err != nil {
			m.discard(inst)
			return nil, "", fmt.Errorf("sandbox: starting %s: %w", rec.ID, err)
		}
	} else {
		nreq, err := m.nodeRequest(ctx, rec)
		if err != nil {
			return nil, "", err
		}
		if plan.snapshotDir != "" {
			// Restored with its processes running. The envd in the
			// snapshot has the snapshotted sandbox's token; /init gives
			// it this sandbox's.
			token = plan.tmpl.SnapshotToken
			nreq.DiskImage = plan.diskImage
			inst, err = m.cfg.Node.Restore(ctx, nreq, plan.snapshotDir)
		} else {
			inst, err = m.cfg.Node.Create(ctx, nreq)
		}
		if err != nil {
			return nil, "", fmt.Errorf("sandbox: starting %s: %w", rec.ID, err)
		}
	}
	if inst.Egress() == nil {
		// A warm sandbox: its policy goes on before its user gets it.
		if err := m.applyEgress(rec, inst); err != nil {
			m.discard(inst)
			return nil, "", err
		}
	}
	return inst, token, nil
}

// recordRunning records the started sandbox as running; its clock starts
// now, when it is usable.
func (m *Manager) recordRunning(ctx context.Context, id string, inst *node.Instance, timeout time.Duration) (store.Sandbox, error) {
	started := time.Now()
	rec, err := m.cfg.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		s.State = store.StateRunning
		s.Slot = inst.Slot.Name
		s.StartedAt = started
		s.EndAt = started.Add(timeout)
		return nil
	})
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox: recording %s: %w", id, err)
	}
	return rec, nil
}

// goLive adds the started sandbox to the live set and runs envd's /init
// (its identity, environment and final token) in the background: the
// create's one round trip into the sandbox, a few milliseconds, made
// while the answer goes back to the client. Until it is done the proxy
// holds the sandbox's traffic (Resolve) and every lifecycle operation
// waits for l.mu, which the init holds; a failed init removes the
// sandbox, so that nothing ever reaches an envd that lacks its
// environment or token.
func (m *Manager) goLive(ctx context.Context, l *live, rec store.Sandbox, inst *node.Instance, token string, res Resources, tmplEnvs map[string]string, warmed bool) {
	tr := steptrace.From(ctx)
	initCtx, cancelInit := context.WithTimeout(context.WithoutCancel(ctx), initTimeout)
	l.initDone, l.cancelInit = make(chan struct{}), cancelInit
	l.mu.Lock()
	m.mu.Lock()
	m.live[rec.ID] = l
	m.starting.add(res, -1)
	tracked := !m.closed // Close waits for it
	if tracked {
		m.wg.Add(1)
	}
	m.mu.Unlock()
	envs := m.withTrust(tmplEnvs)
	go func() {
		if tracked {
			defer m.wg.Done()
		}
		defer close(l.initDone)
		defer l.mu.Unlock()
		defer cancelInit()
		err := m.initCreated(initCtx, inst, l.transport, token, rec, envs)
		tr.Mark("envd-init")
		if err != nil {
			if initCtx.Err() == context.Canceled {
				return // a kill came first and removes it
			}
			m.log.Error("sandbox removed: its envd could not be initialised", "sandbox", rec.ID, "err", err)
			if kerr := m.killLocked(context.Background(), l); kerr != nil {
				m.log.Error("removing a sandbox whose envd could not be initialised", "sandbox", rec.ID, "err", kerr)
			}
			return
		}
		if tr != nil {
			m.log.DebugContext(initCtx, "sandbox created", "sandbox", rec.ID, "warm", warmed, "envd", inst.EnvdURL(), "steps", tr.String())
		}
	}()
}

func (m *Manager) validateCreate(req CreateRequest) error {
	if err := validateCreate(req); err != nil {
		return err
	}
	if err := checkTerm("timeout", req.Timeout, m.maxTimeout()); err != nil {
		return err
	}
	if req.AutoPause && (req.AutoPauseMemory == nil || *req.AutoPauseMemory) && !m.canCheckpoint() {
		return fmt.Errorf("%w: autoPause keeps the sandbox's memory, which needs checkpoints, and this node's %s runtime cannot checkpoint here (%s): set autoPauseMemory false to keep only its files",
			ErrInvalid, m.cfg.Node.Runtime().Name(), m.cfg.Node.Runtime().Capabilities().CheckpointDetail)
	}
	return nil
}

func (m *Manager) canCheckpoint() bool { return m.cfg.Node.Runtime().Capabilities().Checkpoint }

// newLive is a live sandbox of record r: running in inst, or paused (inst
// nil, parked where r says).
func (m *Manager) newLive(r store.Sandbox, inst *node.Instance) *live {
	ex := ParseExtra(r.Extra)
	l := &live{
		id: r.ID, teamID: r.TeamID, inst: inst, transport: proxy.NewTransport(),
		paused: r.State == store.StatePaused, pausedAt: r.PausedAt, autoResume: r.AutoResume,
		envdToken: r.EnvdAccessToken, cpuCount: r.CPUCount, memoryMB: r.MemoryMB, startedAt: r.StartedAt,
	}
	if l.paused {
		l.parked = node.Paused{ID: r.ID, Dir: r.RootfsDir, Checkpoint: r.Checkpoint}
		if l.pausedAt.IsZero() {
			// Paused before pause times were recorded: its retention starts now.
			l.pausedAt = time.Now()
		}
	}
	if ex.Network != nil {
		if ex.Network.AllowPublicTraffic != nil && !*ex.Network.AllowPublicTraffic {
			l.trafficToken = r.TrafficAccessToken
		}
		l.maskHost = ex.Network.MaskRequestHost
	}
	return l
}

// checkpointSpace refuses a checkpoint of a sandbox of memoryMB when the
// data dir would be left with less than the reserve.
func (m *Manager) checkpointSpace(memoryMB int) error {
	if m.cfg.FreeDiskMB == nil {
		return nil
	}
	free, err := m.cfg.FreeDiskMB()
	if err != nil {
		return fmt.Errorf("sandbox: reading the data dir's free space: %w", err)
	}
	if free-int64(memoryMB) < m.cfg.DiskReserveMB {
		return fmt.Errorf("%w: %w: the node's data disk has %d MB free, too little for a checkpoint of up to %d MB above the %d MB it keeps in reserve (--disk-reserve-mb); retry later",
			ErrNoCapacity, ErrDiskFull, free, memoryMB, m.cfg.DiskReserveMB)
	}
	return nil
}

// createSpace refuses a new sandbox when this node's data disk (where its
// root filesystem's writable layer goes) is below the reserve. The
// node checks it, not the api: in a cluster the api's disk is another
// machine's.
func (m *Manager) createSpace() error {
	if m.cfg.FreeDiskMB == nil || m.cfg.DiskReserveMB <= 0 {
		return nil
	}
	free, err := m.cfg.FreeDiskMB()
	if err != nil {
		return fmt.Errorf("sandbox: reading the data dir's free space: %w", err)
	}
	if free < m.cfg.DiskReserveMB {
		return fmt.Errorf("%w: %w: the node's data disk has %d MB free, less than the %d MB it keeps in reserve (--disk-reserve-mb): nothing new is made until space is freed; retry later",
			ErrNoCapacity, ErrDiskFull, free, m.cfg.DiskReserveMB)
	}
	return nil
}
