package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/hostres"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/steptrace"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// Pause, resume, kill, and the reaper.

// Timeouts of resumes that name none: POST /sandboxes/{id}/resume's (E2B's
// default sandbox timeout) and a resume by proxy traffic's (E2B's
// auto-resume default).
const (
	DefaultResumeTimeout  = 15 * time.Second
	TrafficResumeTimeout  = 5 * time.Minute
	autoPauseRetryBackoff = 30 * time.Second
)

// ResumeError says that a paused sandbox could not be resumed, and which
// step failed. The sandbox is still paused, its files and checkpoint
// intact, and a later resume may succeed; the API answers 500 with Step
// (Err, which may name host paths, goes to the log only).
type ResumeError struct {
	ID   string
	Step string
	Err  error
}

func (e *ResumeError) Error() string {
	return fmt.Sprintf("sandbox: resuming %s failed %s: %v", e.ID, e.Step, e.Err)
}

func (e *ResumeError) Unwrap() error { return e.Err }

// Kill ends a team's sandbox and removes it, running or paused.
func (m *Manager) Kill(ctx context.Context, teamID team.ID, id string) error {
	return m.killIn(ctx, teamID.Scope(), id)
}

// killIn is Kill of a sandbox in scope: a team's, or all teams' for the
// manager's own work (a drain).
func (m *Manager) killIn(ctx context.Context, scope store.TeamScope, id string) error {
	teamID := scope.Team() // "" for all teams, of which RemoveFromBlobStore finds nothing
	l, err := m.lookup(scope, id)
	if err == nil {
		teamID = l.teamID
		// A copy here of a sandbox another node took over from the blob
		// store goes, and then the sandbox itself if that node is lost
		// (below).
		if err := m.kill(ctx, l); err != nil || m.cfg.Blobs == nil {
			return err
		}
	}
	if m.cfg.Blobs != nil && (err == nil || errors.Is(err, ErrNotFound)) {
		// Paused in the blob store by a node that is lost: the api
		// hands its kill to this one (RemoveFromBlobStore).
		rerr := RemoveFromBlobStore(context.WithoutCancel(ctx), m.cfg.Store, m.cfg.Blobs, m.cfg.NodeName, teamID, id)
		switch {
		case rerr == nil:
			m.log.InfoContext(ctx, "killed a sandbox paused in the blob store by another node", "sandbox", id)
			return nil
		case !errors.Is(rerr, ErrNotFound):
			return rerr
		}
	}
	return err
}

func (m *Manager) kill(ctx context.Context, l *live) error {
	if l.cancelInit != nil {
		l.cancelInit() // an /init still under way holds l.mu
	}
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
	if !l.paused {
		m.uncountLocked(l.teamID)
	}
	inst, parked := l.inst, l.parked
	m.mu.Unlock()
	// Before anything is taken apart: its streams end now, not when
	// their clients give up on a sandbox that no longer answers.
	m.endTraffic(l)
	ctx = context.WithoutCancel(ctx) // a client hanging up must not leave it half-removed
	blob := ""
	_, err := m.cfg.Store.UpdateSandbox(ctx, l.id, func(s *store.Sandbox) error {
		if inst == nil && s.Node != m.cfg.NodeName {
			return errMovedAway
		}
		s.State, blob = store.StateKilled, s.PausedBlob
		return nil
	})
	switch {
	case errors.Is(err, errMovedAway):
		// Another node took it over from the blob store while this one
		// was lost: only this node's copy goes.
		l.transport.CloseIdleConnections()
		if err := m.cfg.Node.DeletePaused(ctx, parked); err != nil {
			return fmt.Errorf("sandbox: removing the copy of %s: %w", l.id, err)
		}
		m.log.InfoContext(ctx, "removed the copy of a sandbox another node took over", "sandbox", l.id)
		return nil
	case err != nil:
		m.log.WarnContext(ctx, "recording kill", "sandbox", l.id, "err", err)
	default:
		m.dropBlob(l.teamID, blob)
	}
	l.transport.CloseIdleConnections()
	if inst != nil {
		err = m.cfg.Node.Delete(ctx, inst)
	} else {
		err = m.cfg.Node.DeletePaused(ctx, parked) // its checkpoint and files
	}
	if err != nil {
		// The record stays "killed": the next start removes what is left.
		return fmt.Errorf("sandbox: removing %s: %w", l.id, err)
	}
	l.transport.CloseIdleConnections()
	m.forget(ctx, l.id)
	return nil
}

// uncountLocked takes a sandbox off its team's count.
func (m *Manager) uncountLocked(teamID string) {
	m.perTeam[teamID]--
	if m.perTeam[teamID] <= 0 {
		delete(m.perTeam, teamID)
	}
}

// Pause pauses a running sandbox to disk, with its memory (keepMemory) or
// only its files. It reports false if the sandbox was already paused.
func (m *Manager) Pause(ctx context.Context, teamID team.ID, id string, keepMemory bool) (bool, error) {
	return m.pauseIn(ctx, teamID.Scope(), id, keepMemory)
}

// pauseIn is Pause of a sandbox in scope: a team's, or all teams' for the
// manager's own work (a drain).
func (m *Manager) pauseIn(ctx context.Context, scope store.TeamScope, id string, keepMemory bool) (bool, error) {
	l, err := m.lookup(scope, id)
	if err != nil {
		return false, err
	}
	if keepMemory && !m.canCheckpoint() {
		return false, fmt.Errorf("%w: pausing with the memory needs checkpoints, which this node's %s runtime cannot do here (%s): pause with {\"memory\": false} to keep only the files",
			ErrInvalid, m.cfg.Node.Runtime().Name(), m.cfg.Node.Runtime().Capabilities().CheckpointDetail)
	}
	if err := m.checkStorable(l); err != nil {
		return false, err
	}
	return m.pause(ctx, l, keepMemory)
}

// pause checkpoints l to disk and releases everything else it holds. The
// record says paused (and where it is kept) before the runtime acts; a
// checkpoint that fails leaves the sandbox running and its record as it
// was.
//
// It answers once the sandbox is saved and its memory freed; the rest of
// the release (the runtime's state and cgroup, the root filesystem's
// mounts, the slot: some 50 ms) goes on in the background, still holding
// l.mu, so that nothing else acts on the sandbox before it is done.
func (m *Manager) pause(ctx context.Context, l *live, keepMemory bool) (_ bool, err error) {
	defer m.observe(OpPause, time.Now(), &err)
	l.mu.Lock()
	paused, release, err := m.pauseLocked(ctx, l, keepMemory)
	if release == nil {
		l.mu.Unlock()
		return paused, err
	}
	go func() {
		defer l.mu.Unlock()
		release()
	}()
	return paused, err
}

// pauseLocked is pause with l.mu held; release, if not nil, must run
// (with l.mu still held) to finish the pause.
func (m *Manager) pauseLocked(ctx context.Context, l *live, keepMemory bool) (_ bool, release func(), _ error) {
	paused, err := m.pausedNow(l)
	if err != nil || paused {
		return false, nil, err
	}
	if keepMemory {
		if err := m.checkpointSpace(l.memoryMB); err != nil {
			return false, nil, err
		}
	}
	inst := m.instance(l)
	pausedAt := time.Now()
	checkpoint := ""
	if keepMemory {
		checkpoint = inst.Rootfs.CheckpointDir()
	}
	// The slot is released by the pause: the record no longer names it,
	// so that a restart never releases a slot another sandbox took since.
	if err := m.setState(ctx, l.id, store.StatePaused, func(s *store.Sandbox) {
		s.PausedAt, s.Slot = pausedAt, ""
		s.RootfsDir, s.Checkpoint = inst.Rootfs.Home(), checkpoint
	}); err != nil {
		return false, nil, err
	}
	slot := inst.Slot.Name
	p, err := m.cfg.Node.SaveToDisk(ctx, inst, keepMemory)
	if err != nil {
		m.restoreState(ctx, l.id, store.StateRunning, func(s *store.Sandbox) {
			s.PausedAt, s.Slot, s.RootfsDir, s.Checkpoint = time.Time{}, slot, "", ""
		})
		return false, nil, fmt.Errorf("sandbox: pausing %s: %w", l.id, err)
	}
	l.transport.CloseIdleConnections()
	m.mu.Lock()
	l.inst, l.parked, l.paused, l.pausedAt = nil, p, true, pausedAt
	m.uncountLocked(l.teamID)
	m.mu.Unlock()
	// Its processes are saved and gone: what the proxy still carries to
	// it ends now (nothing registers once it is marked paused).
	m.endTraffic(l)
	home := inst.Rootfs.Home() // ReleaseSaved lets go of inst.Rootfs
	if m.cfg.Blobs != nil {
		// Answered once durable in the store: the release (unmounting,
		// which writes the disk image through) comes first, here.
		if err := m.cfg.Node.ReleaseSaved(context.WithoutCancel(ctx), inst); err != nil {
			m.log.WarnContext(ctx, "pausing left something behind", "sandbox", l.id, "err", err)
		}
		go m.recordPausedDisk(l.teamID, l.id, home, checkpoint)
		if err := m.storePaused(ctx, l.teamID, l.id, home); err != nil {
			m.log.ErrorContext(ctx, "storing a paused sandbox in the blob store", "sandbox", l.id, "err", err)
			go m.flush(p)
			return true, nil, fmt.Errorf("sandbox: %s is paused on its node but %w: %v", l.id, ErrBlobStore, err)
		}
		go m.trimCopies(context.WithoutCancel(ctx))
		return true, nil, nil
	}
	release = func() {
		if err := m.cfg.Node.ReleaseSaved(context.WithoutCancel(ctx), inst); err != nil {
			// Saved, but something of it was not released; the next
			// resume or kill takes it down.
			m.log.WarnContext(ctx, "pausing left something behind", "sandbox", l.id, "err", err)
		}
		go m.flush(p) // durable across a power loss; needs no lock
		go m.recordPausedDisk(l.teamID, l.id, home, checkpoint)
	}
	return true, release, nil
}

// recordPausedDisk records what a paused sandbox's kept files (its root
// filesystem's dir with its disk image, and its memory checkpoint) take
// of the node's disk: its team's disk quota counts it while it stays
// paused.
func (m *Manager) recordPausedDisk(teamID, id string, dirs ...string) {
	n, err := hostres.AllocatedBytes(dirs...)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = m.cfg.Store.SetDiskUse(ctx, store.DiskUse{Kind: store.DiskPaused, ObjectID: id, TeamID: teamID,
			Node: m.cfg.NodeName, Bytes: n, UpdatedAt: time.Now()})
	}
	if err != nil {
		m.log.Warn("recording a paused sandbox's disk use", "sandbox", id, "err", err)
	}
}

// ResumeOptions are what a resume may change.
type ResumeOptions struct {
	// Timeout is the resumed sandbox's new term, from now.
	Timeout time.Duration
	// AutoPause, if set, replaces the sandbox's.
	AutoPause *bool
	// Memory restores the checkpointed memory when there is one; false
	// boots the sandbox anew on its files (E2B's onResume "reboot").
	Memory bool
}

// ResumeSandbox resumes a team's paused sandbox (POST /resume); a running
// one is ErrConflict.
func (m *Manager) ResumeSandbox(ctx context.Context, teamID team.ID, id string, opts ResumeOptions) (store.Sandbox, error) {
	if err := checkTerm("timeout", opts.Timeout, m.maxTimeout()); err != nil {
		return store.Sandbox{}, err
	}
	l, err := m.lookupOrAdopt(ctx, teamID, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	rec, resumed, err := m.resume(ctx, l, opts, nil)
	if err == nil && !resumed {
		err = fmt.Errorf("%w: sandbox %s is already running", ErrConflict, id)
	}
	return rec, err
}

// Connect returns a team's sandbox, running: a paused one is resumed for
// timeout (resumed is true), a running one lives at least timeout longer.
// memory false boots a paused sandbox anew instead of restoring its memory.
func (m *Manager) Connect(ctx context.Context, teamID team.ID, id string, timeout time.Duration, memory bool) (rec store.Sandbox, resumed bool, err error) {
	if err := checkTerm("timeout", timeout, m.maxTimeout()); err != nil {
		return store.Sandbox{}, false, err
	}
	l, err := m.lookupOrAdopt(ctx, teamID, id)
	if err != nil {
		return store.Sandbox{}, false, err
	}
	if rec, resumed, err = m.resume(ctx, l, ResumeOptions{Timeout: timeout, Memory: memory}, nil); err != nil || resumed {
		return rec, resumed, err
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
	return rec, false, err
}

// resume restores a paused sandbox on this node; it reports whether it
// was paused. It is admitted like a create (its resources and its team's
// count). The record says running, with its new slot, before the runtime
// acts; a failed resume puts the record back (paused, files and checkpoint
// kept) and returns a *ResumeError. A resume starts a new term: the
// sandbox expires opts.Timeout from now, whenever its old term ended.
// reserveTeam, if set, also takes a place in the team's limit beyond this
// node (Config.ReserveForTeam) once the sandbox is known to be paused,
// given back when the resume has ended (by then it runs, and counts).
func (m *Manager) resume(ctx context.Context, l *live, opts ResumeOptions, reserveTeam func(context.Context, string) (func(), error)) (_ store.Sandbox, _ bool, err error) {
	defer m.observe(OpResume, time.Now(), &err)
	// The steps' durations go to the debug log (make bench reads them).
	tr := steptrace.New()
	ctx = steptrace.With(ctx, tr)
	l.mu.Lock()
	defer l.mu.Unlock()
	tr.Mark("lock")
	paused, err := m.pausedNow(l)
	if err != nil || !paused {
		return store.Sandbox{}, false, err
	}
	if reserveTeam != nil {
		release, err := reserveTeam(ctx, l.teamID)
		if err != nil {
			return store.Sandbox{}, false, err
		}
		defer release()
	}
	rec, err := m.cfg.Store.GetSandbox(ctx, l.id)
	if err != nil {
		return store.Sandbox{}, false, err
	}
	if rec.Node != m.cfg.NodeName {
		// Taken over by another node from the blob store while this one
		// was lost: this copy is stale.
		go m.kill(context.WithoutCancel(ctx), l)
		return store.Sandbox{}, false, fmt.Errorf("%w: %s (it moved to node %s)", ErrNotFound, l.id, rec.Node)
	}
	res := Resources{CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB}
	full, err := m.reserve(l.teamID, res)
	if err == nil && full != nil && !m.evictWarmFor(res) {
		m.unreserve(l.teamID, res)
		err = full // the warm sandboxes made no room
	}
	if err != nil {
		return store.Sandbox{}, false, err
	}
	admitted := false
	defer func() {
		if !admitted {
			m.unreserve(l.teamID, res)
		}
	}()
	nreq, err := m.nodeRequest(ctx, rec)
	if err != nil {
		return store.Sandbox{}, false, &ResumeError{ID: l.id, Step: "reading its record", Err: err}
	}
	m.mu.Lock()
	parked, pausedAt := l.parked, l.pausedAt
	m.mu.Unlock()
	if err := m.fetchIfEvicted(ctx, l.teamID, rec, parked); err != nil {
		step := "fetching it back from the blob store"
		if errors.Is(err, blobstore.ErrCorrupt) {
			step = "verifying its blob from the store (" + err.Error() + ")"
		}
		return store.Sandbox{}, false, &ResumeError{ID: l.id, Step: step, Err: err}
	}
	tr.Mark("admit")
	committed := false
	inst, err := m.cfg.Node.ResumeFromDisk(ctx, nreq, parked, opts.Memory, func(inst *node.Instance) error {
		_, err := m.cfg.Store.UpdateSandbox(ctx, l.id, func(s *store.Sandbox) error {
			if s.Node != m.cfg.NodeName {
				// Another node took it over from the blob store
				// meanwhile: it must not run here too.
				return fmt.Errorf("%w: %s (it moved to node %s)", ErrNotFound, l.id, s.Node)
			}
			s.State, s.Slot = store.StateRunning, inst.Slot.Name
			return nil
		})
		if err != nil {
			return err
		}
		committed = true
		m.faultPoint("resume-before-restore", l.id)
		return nil
	})
	if err != nil {
		if committed {
			m.restoreState(ctx, l.id, store.StatePaused, func(s *store.Sandbox) { s.Slot, s.PausedAt = "", pausedAt })
		}
		m.log.ErrorContext(ctx, "resume failed; the sandbox stays paused", "sandbox", l.id, "err", err)
		step := "preparing it"
		var ne *node.ResumeError
		if errors.As(err, &ne) {
			step = ne.Step
		}
		return store.Sandbox{}, false, &ResumeError{ID: l.id, Step: step, Err: err}
	}
	m.faultPoint("resume-after-restore", l.id)
	booted := !opts.Memory || parked.Checkpoint == ""
	if booted {
		err = initEnvd(ctx, inst, l.transport, rec.EnvdAccessToken, rec, m.templateEnvs(rec))
	} else {
		err = syncClock(ctx, inst, l.transport, rec)
	}
	if err != nil {
		m.log.WarnContext(ctx, "initialising envd after a resume", "sandbox", l.id, "err", err)
	}
	tr.Mark("envd-init")
	now := time.Now()
	oldBlob := ""
	rec, err = m.cfg.Store.UpdateSandbox(context.WithoutCancel(ctx), l.id, func(s *store.Sandbox) error {
		s.State, s.Slot, s.PausedAt = store.StateRunning, inst.Slot.Name, time.Time{}
		s.RootfsDir, s.Checkpoint = "", ""
		oldBlob, s.PausedBlob = s.PausedBlob, ""
		s.StartedAt, s.EndAt = now, now.Add(opts.Timeout)
		if opts.AutoPause != nil {
			s.AutoPause = *opts.AutoPause
		}
		return nil
	})
	if err != nil {
		// It runs, and its record says so (with its slot): only the new
		// term was not written.
		m.log.ErrorContext(ctx, "recording a resume", "sandbox", l.id, "err", err)
		rec, _ = m.cfg.Store.GetSandbox(context.WithoutCancel(ctx), l.id)
	}
	tr.Mark("store-update")
	if err == nil {
		m.dropBlob(l.teamID, oldBlob) // it runs: its paused files are history
	}
	if err := m.cfg.Node.DropCheckpoint(parked); err != nil {
		m.log.WarnContext(ctx, "removing a resumed sandbox's checkpoint", "sandbox", l.id, "err", err)
	}
	tr.Mark("drop-checkpoint")
	m.mu.Lock()
	l.inst, l.parked, l.paused, l.pausedAt = inst, node.Paused{}, false, time.Time{}
	l.startedAt, l.pauseRetry = now, time.Time{}
	m.starting.add(res, -1) // its team count stays, now the running sandbox's
	m.mu.Unlock()
	admitted = true
	m.log.Debug("sandbox resumed", "sandbox", l.id, "steps", tr.String())
	return rec, true, nil
}

// templateEnvs is the environment a sandbox's template gave it.
func (m *Manager) templateEnvs(rec store.Sandbox) map[string]string {
	img, _ := parseImage(rec)
	return m.withTrust(img.Envs)
}

// withTrust is a template's environment over the node's trust variables
// (node.TrustEnv: its egress CA), which the template may override.
func (m *Manager) withTrust(templateEnvs map[string]string) map[string]string {
	envs := map[string]string{}
	for k, v := range m.cfg.Node.TrustEnv() {
		envs[k] = v
	}
	for k, v := range templateEnvs {
		envs[k] = v
	}
	return envs
}

// lookupOrAdopt is lookup, falling back to taking over the sandbox from
// the blob store when another node paused it there (blobs.go).
func (m *Manager) lookupOrAdopt(ctx context.Context, teamID team.ID, id string) (*live, error) {
	l, err := m.lookup(teamID.Scope(), id)
	if errors.Is(err, ErrNotFound) && m.cfg.Blobs != nil {
		return m.adoptFromBlob(ctx, teamID.String(), id)
	}
	return l, err
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

// setState records a sandbox's state, with what change sets beside it.
func (m *Manager) setState(ctx context.Context, id string, st store.SandboxState, change func(*store.Sandbox)) error {
	_, err := m.cfg.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		s.State = st
		change(s)
		return nil
	})
	return err
}

// restoreState puts back the record of a transition the runtime failed,
// whatever the caller's context.
func (m *Manager) restoreState(ctx context.Context, id string, st store.SandboxState, change func(*store.Sandbox)) {
	if err := m.setState(context.WithoutCancel(ctx), id, st, change); err != nil {
		m.log.ErrorContext(ctx, "restoring a sandbox's record after a failed transition", "sandbox", id, "state", st, "err", err)
	}
}

// flush makes a paused sandbox's files durable: the checkpoint and the
// disk image reach the disk within seconds anyway (writeback), but a
// power loss before then would leave a checkpoint that cannot restore.
func (m *Manager) flush(p node.Paused) {
	if err := node.Flush(p); err != nil {
		m.log.Warn("flushing a paused sandbox to disk", "sandbox", p.ID, "err", err)
	}
}

// Resolve implements proxy.Resolver: it finds a live sandbox for sandbox
// traffic without changing it. A paused sandbox is found only when it was
// created with autoResume; the proxy then calls Resume, after it has
// checked the request's token, and resolves it again.
func (m *Manager) Resolve(ctx context.Context, id string) (proxy.Target, error) {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l != nil {
		// A sandbox just created answers once its envd is initialised.
		if err := l.initialised(ctx); err != nil {
			return proxy.Target{}, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	l = m.live[id]
	if l == nil || (l.paused && !l.autoResume) {
		return proxy.Target{}, proxy.ErrNotFound
	}
	t := proxy.Target{
		Transport: l.transport, TrafficToken: l.trafficToken, MaskRequestHost: l.maskHost,
		EnvdAccessToken: l.envdToken, Paused: l.paused,
	}
	if l.inst != nil {
		t.IP = l.inst.Slot.SandboxIP
	}
	return t, nil
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
	m.mu.Lock()
	cands := make([]proxy.SignedCandidate, 0, len(m.live))
	for id, l := range m.live {
		if !l.paused || l.autoResume {
			cands = append(cands, proxy.SignedCandidate{ID: id, EnvdAccessToken: l.envdToken})
		}
	}
	m.mu.Unlock()
	return proxy.FirstSigned(cands, signed)
}

// Resume implements proxy.Resolver: it resumes a paused autoResume
// sandbox for traffic that has shown its credentials, for
// TrafficResumeTimeout.
func (m *Manager) Resume(ctx context.Context, id string) error {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l == nil || !l.autoResume {
		return proxy.ErrNotFound
	}
	if _, _, err := m.resume(ctx, l, ResumeOptions{Timeout: TrafficResumeTimeout, Memory: true}, m.cfg.ReserveForTeam); err != nil {
		switch {
		case errors.Is(err, ErrNotFound):
			return proxy.ErrNotFound
		case errors.Is(err, ErrTeamLimit):
			return fmt.Errorf("%w: %v", proxy.ErrTeamLimit, err)
		}
		return err
	}
	return nil
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
			continue // paused sandboxes stay until killed, resumed or retired
		}
		l, err := m.lookup(store.AllTeams(), r.ID)
		if err != nil {
			continue
		}
		m.expire(ctx, l)
	}
}

// expire pauses (autoPause) or kills an expired sandbox, if it still is
// expired once its lock is held: a connect, refresh or resume may have
// given it a new term since the reaper listed it.
func (m *Manager) expire(ctx context.Context, l *live) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := m.cfg.Store.GetSandbox(ctx, l.id)
	if err != nil || r.State != store.StateRunning || r.EndAt.After(time.Now()) {
		return
	}
	if r.AutoPause {
		m.autoPause(ctx, l, r)
		return
	}
	if err := m.killLocked(ctx, l); err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Warn("ending an expired sandbox", "sandbox", r.ID, "err", err)
	} else if err == nil {
		m.log.Info("sandbox timed out", "sandbox", r.ID, "paused", false)
	}
}

// autoPause pauses an expired autoPause sandbox (l.mu held). One that
// cannot be paused now (no disk for the checkpoint, say) runs on and is
// tried again after autoPauseRetryBackoff.
func (m *Manager) autoPause(ctx context.Context, l *live, r store.Sandbox) {
	m.mu.Lock()
	wait := time.Now().Before(l.pauseRetry)
	m.mu.Unlock()
	if wait {
		return
	}
	_, release, err := m.pauseLocked(ctx, l, r.AutoPauseMemory && m.canCheckpoint())
	if release != nil {
		release()
	}
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		m.mu.Lock()
		l.pauseRetry = time.Now().Add(autoPauseRetryBackoff)
		m.mu.Unlock()
		m.log.Warn("pausing an expired sandbox failed; it runs on and is tried again", "sandbox", r.ID, "retry_in", autoPauseRetryBackoff, "err", err)
	default:
		m.log.Info("sandbox timed out", "sandbox", r.ID, "paused", true)
	}
}

// reapPaused removes the sandboxes paused for longer than the retention,
// with their checkpoints.
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
			m.log.Info("removed a sandbox paused longer than the retention (--paused-retention), with its checkpoint",
				"sandbox", l.id, "team", l.teamID, "paused_at", pausedAt, "retention", m.cfg.PausedRetention)
		}
	}
}
