package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/store"
)

// Recovery after a restart (or a host reboot): what the store says of each
// sandbox of this node, against what the node still has.
//
//	running, not being resumed   adopted (container, root filesystem, slot)
//	running, being resumed       its record still names its kept files: if
//	                             the resume got as far as a running
//	                             container, it is adopted; else it is
//	                             paused again (what the resume took goes)
//	paused on disk               kept; a container an interrupted pause
//	                             left running is paused again now, anything
//	                             else it left (mounts, a half-written
//	                             checkpoint) goes; a checkpoint that never
//	                             completed means its memory is lost, and
//	                             it resumes by booting on its files
//	paused in place (frozen; a   thawed, then paused to disk
//	record of before the pause
//	to disk existed)
//	creating or killed           removed
//
// Everything else on the node (containers, root filesystems, slots nobody
// knows, forks' snapshots) is removed.

// recover reconciles the store with the node.
func (m *Manager) recover(ctx context.Context) error {
	recs, err := m.cfg.Store.ListSandboxes(ctx, store.SandboxFilter{Teams: store.AllTeams(), Node: m.cfg.NodeName})
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
	m.removeForkSnapshots()
	for _, r := range recs {
		if _, ok := keep[r.ID]; !ok {
			// Creating (interrupted) or killed (its resources are gone now).
			m.forget(ctx, r.ID)
			continue
		}
		if r.Image == "" {
			r = m.backfillImage(ctx, r)
		}
		var l *live
		switch {
		case r.State == store.StatePaused && r.RootfsDir == "":
			l, err = m.repauseFrozen(ctx, r)
		case r.State == store.StatePaused:
			l, err = m.settlePaused(ctx, r)
		case r.RootfsDir != "":
			l, err = m.settleResume(ctx, r)
		default:
			l, err = m.adopt(ctx, r)
		}
		if err != nil {
			m.log.Warn("sandbox did not survive the restart", "sandbox", r.ID, "state", r.State, "err", err)
			m.forget(ctx, r.ID)
			continue
		}
		m.mu.Lock()
		m.live[r.ID] = l
		if !l.paused {
			m.perTeam[r.TeamID]++
		}
		m.mu.Unlock()
		m.log.Info("adopted sandbox", "sandbox", r.ID, "paused", l.paused)
	}
	return nil
}

// adopt takes over a running sandbox.
func (m *Manager) adopt(ctx context.Context, r store.Sandbox) (*live, error) {
	inst, err := m.cfg.Node.Adopt(ctx, r.ID, r.Slot)
	if err != nil {
		if inst != nil {
			_ = m.cfg.Node.Delete(ctx, inst)
		}
		return nil, err
	}
	// network.New carried the slot's rules over; this puts them (and the
	// egress proxy's registration) back from the record, which wins.
	if err := m.applyEgress(r, inst); err != nil {
		m.log.Error("re-applying an adopted sandbox's egress policy", "sandbox", r.ID, "err", err)
	}
	return m.newLive(r, inst), nil
}

// settlePaused keeps a sandbox paused on disk, finishing or cleaning up
// after a pause the restart cut short.
func (m *Manager) settlePaused(ctx context.Context, r store.Sandbox) (*live, error) {
	if st, err := m.cfg.Node.State(ctx, r.ID); err == nil && (st == runtime.StateRunning || st == runtime.StatePaused) {
		return m.finishPause(ctx, r, st)
	}
	complete, err := m.cfg.Node.Settle(ctx, r.ID, "", r.Checkpoint)
	if err != nil {
		m.log.Warn("clearing what an interrupted pause left", "sandbox", r.ID, "err", err)
	}
	if _, serr := os.Stat(r.RootfsDir); serr != nil {
		if r.PausedBlob != "" && m.cfg.Blobs != nil {
			// Evicted (trimCopies): its resume fetches it back.
			return m.newLive(r, nil), nil
		}
		return nil, fmt.Errorf("its kept root filesystem is gone: %w", serr)
	}
	if r.Checkpoint != "" && !complete {
		m.log.Warn("a paused sandbox's checkpoint never completed: its memory is lost, and it will boot on its files when resumed", "sandbox", r.ID)
		if r, err = m.cfg.Store.UpdateSandbox(ctx, r.ID, func(s *store.Sandbox) error { s.Checkpoint = ""; return nil }); err != nil {
			return nil, err
		}
	}
	return m.newLive(r, nil), nil
}

// finishPause pauses (again) a sandbox whose pause a restart cut short
// while its container still existed: its network slot is gone (the
// record did not name it), but a checkpoint does not need it.
func (m *Manager) finishPause(ctx context.Context, r store.Sandbox, st runtime.State) (*live, error) {
	inst, err := m.cfg.Node.AdoptKept(ctx, r.ID)
	if err != nil {
		return nil, err
	}
	if st == runtime.StatePaused {
		if err := m.cfg.Node.Thaw(ctx, inst); err != nil {
			return nil, err
		}
	}
	memory := r.Checkpoint != ""
	p, err := m.cfg.Node.PauseToDisk(ctx, inst, memory)
	if err != nil && p.ID == "" {
		_ = m.cfg.Node.Delete(ctx, inst)
		return nil, fmt.Errorf("pausing it again: %w", err)
	}
	if err != nil {
		m.log.Warn("pausing left something behind", "sandbox", r.ID, "err", err)
	}
	return m.newLive(r, nil), nil
}

// settleResume settles a sandbox whose resume a restart cut short: it
// runs if its container got that far, else it is paused again.
func (m *Manager) settleResume(ctx context.Context, r store.Sandbox) (*live, error) {
	if r.Slot != "" {
		if inst, err := m.cfg.Node.Adopt(ctx, r.ID, r.Slot); err == nil {
			p := node.Paused{ID: r.ID, Dir: r.RootfsDir, Checkpoint: r.Checkpoint}
			if err := m.cfg.Node.DropCheckpoint(p); err != nil {
				m.log.Warn("removing a resumed sandbox's checkpoint", "sandbox", r.ID, "err", err)
			}
			oldBlob := ""
			r, err = m.cfg.Store.UpdateSandbox(ctx, r.ID, func(s *store.Sandbox) error {
				s.RootfsDir, s.Checkpoint, s.PausedAt = "", "", time.Time{}
				oldBlob, s.PausedBlob = s.PausedBlob, ""
				return nil
			})
			if err != nil {
				return nil, err
			}
			// It runs: its paused files in the blob store are history,
			// as after a resume that was not cut short.
			m.dropBlob(r.TeamID, oldBlob)
			return m.newLive(r, inst), nil
		}
	}
	if _, err := m.cfg.Node.Settle(ctx, r.ID, r.Slot, r.Checkpoint); err != nil {
		m.log.Warn("clearing what an interrupted resume left", "sandbox", r.ID, "err", err)
	}
	r, err := m.cfg.Store.UpdateSandbox(ctx, r.ID, func(s *store.Sandbox) error {
		s.State, s.Slot = store.StatePaused, ""
		if s.PausedAt.IsZero() {
			s.PausedAt = time.Now()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.log.Warn("a resume was cut short by the restart; the sandbox is paused again", "sandbox", r.ID)
	return m.newLive(r, nil), nil
}

// repauseFrozen turns a sandbox paused in place by an earlier version of
// Warren (frozen, memory still held) into one paused on disk.
func (m *Manager) repauseFrozen(ctx context.Context, r store.Sandbox) (*live, error) {
	inst, err := m.cfg.Node.Adopt(ctx, r.ID, r.Slot)
	if err != nil {
		if inst != nil {
			_ = m.cfg.Node.Delete(ctx, inst)
		}
		return nil, err
	}
	if err := m.cfg.Node.Thaw(ctx, inst); err != nil {
		_ = m.cfg.Node.Delete(ctx, inst)
		return nil, err
	}
	l := m.newLive(r, inst)
	l.paused = false
	m.mu.Lock()
	m.live[r.ID] = l
	m.perTeam[r.TeamID]++
	m.mu.Unlock()
	if _, err := m.pause(ctx, l, m.canCheckpoint()); err != nil {
		m.mu.Lock()
		delete(m.live, r.ID)
		m.uncountLocked(r.TeamID)
		m.mu.Unlock()
		_ = m.cfg.Node.Delete(ctx, inst)
		return nil, fmt.Errorf("pausing it to disk: %w", err)
	}
	m.mu.Lock()
	delete(m.live, r.ID) // recover adds it back
	m.mu.Unlock()
	return l, nil
}

// backfillImage records the image of a sandbox made before records kept
// it: its template as it is now (the best there is; a template rebuilt
// since would not match, and resuming such a sandbox may fail).
func (m *Manager) backfillImage(ctx context.Context, r store.Sandbox) store.Sandbox {
	t, err := m.cfg.Resolve(ctx, r.TeamID, r.TemplateID)
	if err != nil {
		m.log.Warn("a sandbox of before records kept their image: its template is gone", "sandbox", r.ID, "err", err)
		return r
	}
	img := imageOf(t.Image).String()
	if updated, err := m.cfg.Store.UpdateSandbox(ctx, r.ID, func(s *store.Sandbox) error { s.Image = img; return nil }); err == nil {
		return updated
	}
	r.Image = img
	return r
}

// removeForkSnapshots removes the snapshots forks were restoring from when
// the last run stopped: a fork's snapshot lives only for its request.
func (m *Manager) removeForkSnapshots() {
	dirs, _ := filepath.Glob(m.cfg.Images.SnapshotDir(forkSnapshotPrefix + "*"))
	for _, d := range dirs {
		if err := m.cfg.Images.RemoveSnapshot(filepath.Base(d)); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("removing a fork's snapshot", "dir", d, "err", err)
		}
	}
}
