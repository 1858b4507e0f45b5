package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/steptrace"
)

// pool keeps a template's warm sandboxes, sized by its recent creates
// (sizing.go). Its filler goroutine decides how many to start or remove;
// the starts run in parallel and send to ready; Create takes them out.
type pool struct {
	m          *Manager
	templateID string
	floor      int
	ready      chan *warm // capacity: the most the pool may ever hold
	kick       chan struct{}

	// Guarded by m.mu.
	res        Resources       // of the template's creates, learnt from them
	tmpl       *image.Template // as its last create resolved it; nil: read it
	building   int
	target     int
	demand     demand
	starts     startTime
	held       footprint // what its warm sandboxes hold once started
	lastUse    time.Time // the last create of the template
	lastShrink time.Time
	retryAt    time.Time // after a failed start
	backoff    time.Duration
}

// warm is a started sandbox nobody has claimed yet: booted over its
// template's layers, or restored from its template's snapshot.
type warm struct {
	inst   *node.Instance
	token  string   // envd's token until /init: a private one, or the snapshot's
	layers []string // the template's layers it was started from
	// snapshot is the template's snapshot it was restored from, "" for
	// one booted: a rebuilt template's start snapshot has a new ID.
	snapshot string
	res      Resources
	readyAt  time.Time // when it was started: the reconciler judges it only by a later list
}

// startsWarm says whether a create of tmpl with these volume mounts may
// take a warm sandbox (and so whether tmpl's pool is kept). Two kinds
// always start cold:
//   - a create with volume mounts: a warm sandbox started without them
//     cannot get a mount added once it runs;
//   - a template restored from a snapshot of a sandbox that had volumes
//     mounted (SnapshotMounts): its restore needs those team volumes
//     mounted, and a warm sandbox would hold a team's volume mounted, and
//     the volume pinned, before any create of the team asked for it.
//
// Snapshots without volumes are pooled: a build's start snapshot
// (running servers, kernels), and a running sandbox's snapshot used as a
// template, which many creates restore the same way. A fork's snapshot
// is not a template (Template.fork): it lives only while its fork runs.
func startsWarm(tmpl *image.Template, mounts int) bool {
	return mounts == 0 && len(tmpl.SnapshotMounts) == 0
}

// matches says whether w was started from tmpl as it is now, with res.
func (w *warm) matches(tmpl *image.Template, res Resources) bool {
	return w.res == res && w.snapshot == tmpl.Snapshot && slices.Equal(w.layers, tmpl.Layers)
}

// newPoolLocked adds a pool for a template and starts its filler. The
// caller holds m.mu.
func (m *Manager) newPoolLocked(templateID string, floor int, res Resources) *pool {
	capacity := max(floor, m.cfg.MaxSandboxes)
	p := &pool{
		m: m, templateID: templateID, floor: floor, res: res,
		ready: make(chan *warm, capacity), kick: make(chan struct{}, 1),
		demand: newDemand(m.tuning), lastUse: time.Now(), backoff: time.Second, target: floor,
	}
	m.pools[templateID] = p
	m.wg.Add(1)
	go p.fill()
	return p
}

// count is the pool's share of the node: ready and being started. The
// caller holds m.mu.
func (p *pool) count() int { return len(p.ready) + p.building }

// claimWarm counts a create of tmpl with res toward its pool's demand
// (adding a pool for a template that has none) and takes a warm sandbox
// if one is ready that was started from the template as it is now. It
// never waits for a start.
func (m *Manager) claimWarm(tmpl *image.Template, res Resources) *warm {
	now := time.Now()
	m.mu.Lock()
	p := m.pools[tmpl.ID]
	if p == nil && m.cfg.PoolSize > 0 && !m.closed && len(m.pools) < maxPools+len(m.cfg.PoolTemplates) {
		p = m.newPoolLocked(tmpl.ID, 0, res)
	}
	if p != nil {
		p.demand.add(now)
		p.lastUse = now
		if p.res != res {
			p.held = footprint{} // other limits, maybe another footprint
		}
		p.res, p.tmpl = res, tmpl // what its next starts are
	}
	m.mu.Unlock()
	if p == nil {
		return nil
	}
	defer p.refill()
	for {
		var w *warm
		select {
		case w = <-p.ready:
		default:
			return nil
		}
		if w.matches(tmpl, res) {
			return w
		}
		// The template was rebuilt (new layers, or a new start
		// snapshot), or asks other resources, since.
		m.log.Debug("stale warm sandbox discarded", "sandbox", w.inst.ID, "template", tmpl.ID, "snapshot", w.snapshot, "now", tmpl.Snapshot)
		m.discard(w.inst)
	}
}

// ForgetTemplate drops what the warm pool of a removed template image
// holds (its template was deleted): its ready sandboxes are discarded at
// once and its demand forgotten, so that a pool without a floor is
// removed as soon as its starts in flight end, instead of keeping
// sandboxes nobody can claim and starting more of files that are gone.
func (m *Manager) ForgetTemplate(templateID string) {
	m.mu.Lock()
	p := m.pools[templateID]
	if p == nil {
		m.mu.Unlock()
		return
	}
	p.demand = newDemand(m.tuning)
	p.tmpl = nil // a floor's next starts read the template anew
	p.lastUse = time.Time{}
	var drop []*warm
	for taken := true; taken; {
		select { // never blocks: a claim may take one meanwhile
		case w := <-p.ready:
			drop = append(drop, w)
		default:
			taken = false
		}
	}
	m.mu.Unlock()
	m.log.Info("warm pool of a removed template emptied", "template", templateID, "discarded", len(drop))
	for _, w := range drop {
		m.discard(w.inst)
	}
	p.refill()
}

func (p *pool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// fill keeps the pool at its target until the manager stops, or until the
// pool, having no floor, has had no demand and no sandbox for a while.
func (p *pool) fill() {
	m := p.m
	defer m.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-m.stop
		cancel()
	}()
	t := time.NewTicker(m.tuning.tick)
	defer t.Stop()
	for {
		surplus, starts, done := p.plan(time.Now())
		if done {
			return
		}
		if surplus != nil {
			m.discard(surplus.inst)
		}
		for range starts {
			m.wg.Add(1)
			go p.startOne(ctx)
		}
		select {
		case <-m.stop:
			return
		case <-p.kick:
		case <-t.C:
		}
	}
}

// plan re-sizes the pool: a surplus warm sandbox to remove, how many to
// start (already counted as building), or done when the pool is removed.
func (p *pool) plan(now time.Time) (surplus *warm, starts int, done bool) {
	m := p.m
	m.mu.Lock()
	defer m.mu.Unlock()
	tn := m.tuning
	ceiling := min(cap(p.ready), poolCeiling(m.cfg.PoolMaxMemoryMB, p.heldMB(), m.cfg.MaxSandboxes), m.fairCeilingLocked(p, now))
	rate, batch, start := p.demand.rate(now), p.demand.batchSize(now), p.starts.or(tn.defaultStart)
	if target := poolTarget(rate, batch, start, tn, p.floor, ceiling); target != p.target {
		m.log.Debug("warm pool resized", "template", p.templateID, "target", target, "was", p.target,
			"rate", fmt.Sprintf("%.3f", rate), "batch", batch, "start_ms", start.Milliseconds(), "held_mb", p.heldMB(),
			"ready", len(p.ready), "starting", p.building)
		p.target = target
	}
	if p.floor == 0 && p.count() == 0 && p.target == 0 && now.Sub(p.lastUse) >= tn.idleAfter {
		delete(m.pools, p.templateID)
		return nil, 0, true
	}
	if len(p.ready) > p.target && now.Sub(p.lastShrink) >= tn.shrinkEvery {
		select {
		case surplus = <-p.ready:
			p.lastShrink = now
		default:
		}
	}
	if now.Before(p.retryAt) {
		return surplus, 0, false
	}
	for p.building < tn.parallel && p.count() < p.target && p.mayStartLocked() {
		p.building++
		starts++
	}
	return surplus, starts, false
}

// fairCeilingLocked is p's fair share of the pools' memory budget, in
// sandboxes, given what every pool's demand alone would keep warm.
func (m *Manager) fairCeilingLocked(p *pool, now time.Time) int {
	wants := make([]poolWant, 0, len(m.pools))
	at := -1
	for _, q := range m.pools {
		if q == p {
			at = len(wants)
		}
		want := poolTarget(q.demand.rate(now), q.demand.batchSize(now), q.starts.or(m.tuning.defaultStart), m.tuning, q.floor, min(cap(q.ready), m.cfg.MaxSandboxes))
		wants = append(wants, poolWant{floor: q.floor, want: want, memoryMB: q.heldMB()})
	}
	if at < 0 { // a pool being removed
		return p.floor
	}
	return fairCeilings(wants, m.cfg.PoolMaxMemoryMB)[at]
}

// mayStartLocked says whether one more warm sandbox fits: on the node
// (admitted like a create) and, above the floor, in the pools' memory
// budget.
func (p *pool) mayStartLocked() bool {
	m := p.m
	if m.fitsLocked(p.res) != nil {
		return false
	}
	if p.count() < p.floor {
		return true
	}
	return m.pooledMemoryLocked()+p.heldMB() <= m.cfg.PoolMaxMemoryMB
}

// pooledMemoryLocked is the memory the pools' sandboxes hold, as their
// pools measured it.
func (m *Manager) pooledMemoryLocked() int {
	mb := 0
	for _, p := range m.pools {
		mb += p.count() * p.heldMB()
	}
	return mb
}

// heldMB is the memory one warm sandbox of the pool is counted at against
// the budget: what they were measured to hold once started, their limit
// until then. The caller holds m.mu.
func (p *pool) heldMB() int { return p.held.or(p.res.MemoryMB) }

// startOne starts one warm sandbox, counted in building by plan. Failures
// hold the pool's starts back exponentially, up to 30 s.
func (p *pool) startOne(ctx context.Context) {
	m := p.m
	defer m.wg.Done()
	defer p.refill()
	m.mu.Lock()
	res, tmpl := p.res, p.tmpl
	m.mu.Unlock()
	began := time.Now()
	w, err := p.start(ctx, tmpl, res)
	took := time.Since(began)
	var heldMB float64
	if err == nil {
		// What it holds of the node's memory while it waits (page cache
		// it brought in counted too): what the budget counts it at.
		if st, serr := m.cfg.Node.Stats(ctx, w.inst); serr == nil && st.MemoryBytes > 0 {
			heldMB = float64(st.MemoryBytes) / (1 << 20)
		}
	}
	m.mu.Lock()
	p.building--
	if err == nil {
		p.starts.add(took)
		p.backoff = time.Second
		if heldMB > 0 && w.res == p.res {
			p.held.add(heldMB)
		}
	} else if ctx.Err() == nil {
		if p.tmpl == tmpl {
			// Perhaps replaced since (a rebuilt template's old snapshot
			// removed): the next start reads the template anew.
			p.tmpl = nil
		}
		m.log.Warn("starting a warm sandbox failed", "template", p.templateID, "err", err, "retry_in", p.backoff)
		p.retryAt = time.Now().Add(p.backoff)
		p.backoff = min(2*p.backoff, 30*time.Second)
	}
	m.mu.Unlock()
	if err != nil {
		return
	}
	select {
	case <-m.stop:
		m.discard(w.inst)
		return
	default:
	}
	select {
	case p.ready <- w:
	default: // cannot happen: count never exceeds the capacity
		m.discard(w.inst)
	}
}

func (p *pool) start(ctx context.Context, tmpl *image.Template, r Resources) (*warm, error) {
	m := p.m
	if tmpl == nil {
		var err error
		if tmpl, err = m.cfg.Images.Template(p.templateID); err != nil {
			return nil, err
		}
	}
	if !startsWarm(tmpl, 0) {
		return nil, fmt.Errorf("sandbox: template %s restores a snapshot with volumes, which is never started warm", tmpl.ID)
	}
	layers, err := m.cfg.Images.LayerDirs(tmpl)
	if err != nil {
		return nil, err
	}
	tr := steptrace.New()
	ctx = steptrace.With(ctx, tr)
	req := node.CreateRequest{
		ID: NewID(), Layers: layers, CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskSizeMB: r.DiskSizeMB,
		AccessToken: newToken(), User: tmpl.User, Workdir: tmpl.Workdir,
		// It yields the CPU to the sandboxes in use (among them, the one
		// whose claim made this refill) until a create claims it.
		Background: true,
	}
	var inst *node.Instance
	if tmpl.Snapshot != "" {
		// Restored as a cold create of the template is (createFrom): its
		// envd keeps the snapshot's token until the claim's /init.
		dir, diskImage, diskMB, serr := m.snapshotOf(tmpl)
		if serr != nil {
			return nil, serr
		}
		if diskImage != "" {
			r.DiskSizeMB = diskMB // as createFrom counts it, so that a claim matches
		}
		req.AccessToken, req.DiskImage = tmpl.SnapshotToken, diskImage
		inst, err = m.cfg.Node.Restore(ctx, req, dir)
	} else {
		inst, err = m.cfg.Node.Create(ctx, req)
	}
	if err != nil {
		return nil, err
	}
	if err := warmUp(ctx, inst, req.AccessToken, tmpl.User, m.warmTransport); err != nil {
		m.discard(inst)
		return nil, err
	}
	tr.Mark("warm-up")
	m.log.Debug("warm sandbox ready", "sandbox", inst.ID, "template", p.templateID, "snapshot", tmpl.Snapshot, "steps", tr.String())
	return &warm{inst: inst, token: req.AccessToken, layers: tmpl.Layers, snapshot: tmpl.Snapshot, res: r, readyAt: time.Now()}, nil
}

// drain removes the ready warm sandboxes; the filler and its starts have
// stopped.
func (p *pool) drain() error {
	var errs []error
	for {
		select {
		case w := <-p.ready:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			errs = append(errs, p.m.cfg.Node.Delete(ctx, w.inst))
			cancel()
		default:
			return errors.Join(errs...)
		}
	}
}

// evictWarmFor removes ready warm sandboxes, of any pool, until a cold
// create of res (already reserved) fits on the node: warm sandboxes are
// capacity held for creates, never a reason to refuse one. It reports
// whether the create fits now.
func (m *Manager) evictWarmFor(res Resources) bool {
	for {
		m.mu.Lock()
		m.starting.add(res, -1) // the create's own reservation is not in its way
		fits := m.fitsLocked(res) == nil
		m.starting.add(res, 1)
		var w *warm
		if !fits {
			w = m.takeAnyWarmLocked()
		}
		m.mu.Unlock()
		if fits || w == nil {
			return fits
		}
		m.log.Debug("warm sandbox evicted for a cold create", "sandbox", w.inst.ID)
		m.discard(w.inst)
	}
}

// takeAnyWarmLocked takes a ready warm sandbox from the pool with the
// most ready ones, or nil.
func (m *Manager) takeAnyWarmLocked() *warm {
	var most *pool
	for _, p := range m.pools {
		if len(p.ready) > 0 && (most == nil || len(p.ready) > len(most.ready)) {
			most = p
		}
	}
	if most == nil {
		return nil
	}
	select {
	case w := <-most.ready:
		return w
	default:
		return nil
	}
}
