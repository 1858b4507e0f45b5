package sandbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/hostres"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/store"
)

// Paused sandboxes in the blob store (Config.Blobs).
//
// With a blob store, a pause is answered only once the sandbox's kept
// files (its directory: the writable layer's disk image and the memory
// checkpoint) are a blob of its team in the store and the record names
// it (PausedBlob). The node keeps its copy too, so that a resume here
// costs nothing more; any other node can resume the sandbox from the
// blob when this one is lost: it fetches and verifies the blob, unpacks
// it where its own root filesystems live, and takes the record over
// (Node) before it resumes it as its own. A blob that does not match
// its digest is refused and the sandbox stays paused.
//
// Crash safety: the record says paused before the upload starts and
// names the blob only once it is whole; a crash in between leaves the
// sandbox paused on its node (resumable there, as without a store). A
// node taking a sandbox over writes the record only once the files are
// unpacked, and only if the record still names the node and blob it
// read, so two nodes never both resume it.

// ErrBlobStore wraps a failure to store a paused sandbox: it is paused on
// its node, resumable there, but not in the store.
var ErrBlobStore = errors.New("the blob store did not take the paused sandbox")

// errMovedAway: the record of a sandbox paused here names another node,
// which took it over from the blob store.
var errMovedAway = errors.New("sandbox: taken over by another node")

// storePaused packs a paused sandbox's directory, stores it in the blob
// store as a blob of its team, and names it in the record.
func (m *Manager) storePaused(ctx context.Context, teamID, id, home string) error {
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	// A writable layer that is a plain directory (no disk limit) holds
	// owners, modes and overlay whiteouts a pack does not keep.
	if _, err := os.Stat(filepath.Join(home, rootfs.DiskImageName)); err != nil {
		return fmt.Errorf("only a sandbox with a disk image (a disk limit) can be stored: %w", err)
	}
	// Checkpoints of earlier resumes on their way out (node.DropCheckpoint)
	// are garbage, which a pack must not catch half-removed.
	dropped, _ := filepath.Glob(filepath.Join(home, "*.dropped-*"))
	for _, d := range dropped {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	f, err := os.CreateTemp(m.cfg.BlobTemp, id+".pack-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if err := blobstore.Pack(bw, home); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	d, err := blobstore.ParseDigest(blobstore.DigestPrefix + hex.EncodeToString(h.Sum(nil)))
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	packed := time.Now()
	m.faultPoint("pause-before-upload", id)
	var last blobstore.Progress
	progress := func(p blobstore.Progress) { last = p }
	if err := m.cfg.Blobs.Put(blobstore.WithProgress(m.uploadFaults(ctx, id), progress), teamID, d, size, blobstore.HashedFile{File: f}); err != nil {
		return err
	}
	uploaded := time.Now()
	if last.Found > 0 {
		m.log.Info("resumed an upload a crash cut short: the parts it had stored were not sent again", "sandbox", id,
			"reused_parts", last.Reused, "found_parts", last.Found, "parts", last.Total, "sent_bytes", last.Sent)
	}
	m.faultPoint("pause-after-upload", id)
	_, err = m.cfg.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		if s.State != store.StatePaused {
			return fmt.Errorf("%w: sandbox %s is %s", ErrConflict, id, s.State)
		}
		s.PausedBlob = d.String()
		return nil
	})
	if err != nil {
		_ = m.cfg.Blobs.Delete(ctx, teamID, d)
		return err
	}
	m.log.Info("paused sandbox stored in the blob store", "sandbox", id, "blob", d.String(), "bytes", size, "took", time.Since(start).Round(time.Millisecond),
		"pack", packed.Sub(start).Round(time.Millisecond), "upload", uploaded.Sub(packed).Round(time.Millisecond))
	return nil
}

// adoptFromBlob takes over a team's sandbox paused on another node and
// kept in the blob store: fetched, verified, unpacked here and recorded
// as this node's, then live here (paused). ErrNotFound when there is no
// such sandbox for the team, or it has no blob.
func (m *Manager) adoptFromBlob(ctx context.Context, teamID, id string) (*live, error) {
	notFound := fmt.Errorf("%w: %s", ErrNotFound, id)
	if m.cfg.Blobs == nil || teamID == "" {
		return nil, notFound
	}
	m.adoptMu.Lock()
	defer m.adoptMu.Unlock()
	if l, err := m.lookup(store.ForTeam(teamID), id); err == nil {
		return l, nil // taken over meanwhile
	}
	ctx = context.WithoutCancel(ctx)
	rec, err := m.cfg.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (rec.TeamID != teamID || rec.State != store.StatePaused || rec.PausedBlob == "" || rec.Node == m.cfg.NodeName)) {
		return nil, notFound
	}
	if err != nil {
		return nil, err
	}
	d, err := blobstore.ParseDigest(rec.PausedBlob)
	if err != nil {
		return nil, &ResumeError{ID: id, Step: "reading its record", Err: err}
	}
	if err := m.haveLayersOf(ctx, rec); err != nil {
		return nil, &ResumeError{ID: id, Step: "getting its template's layers", Err: err}
	}
	home, err := m.cfg.Node.KeptHome(id)
	if err != nil {
		return nil, &ResumeError{ID: id, Step: "fetching it from the blob store", Err: err}
	}
	// Whatever an earlier attempt left here goes first.
	if err := m.cfg.Node.DeletePaused(ctx, node.Paused{ID: id, Dir: home}); err != nil {
		return nil, &ResumeError{ID: id, Step: "fetching it from the blob store", Err: err}
	}
	start := time.Now()
	m.blobCache(false)
	if err := m.fetchPaused(ctx, teamID, d, home); err != nil {
		_ = os.RemoveAll(home)
		m.log.Error("fetching a paused sandbox from the blob store", "sandbox", id, "blob", d.String(), "err", err)
		step := "fetching it from the blob store"
		if errors.Is(err, blobstore.ErrCorrupt) {
			step = "verifying its blob from the store (" + err.Error() + ")"
		}
		return nil, &ResumeError{ID: id, Step: step, Err: err}
	}
	from := rec.Node
	rec, err = m.cfg.Store.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		if s.TeamID != teamID || s.State != store.StatePaused || s.Node != from || s.PausedBlob != d.String() {
			return fmt.Errorf("%w: sandbox %s changed while it was fetched", ErrConflict, id)
		}
		s.Node, s.Slot, s.RootfsDir = m.cfg.NodeName, "", home
		if s.Checkpoint != "" {
			s.Checkpoint = filepath.Join(home, "checkpoint")
		}
		return nil
	})
	if err != nil {
		_ = os.RemoveAll(home)
		return nil, err
	}
	m.faultPoint("resume-after-claim", id)
	l := m.newLive(rec, nil)
	m.mu.Lock()
	m.live[id] = l
	m.mu.Unlock()
	m.log.Info("took over a sandbox paused on another node, from the blob store", "sandbox", id, "from", from, "blob", d.String(), "took", time.Since(start).Round(time.Millisecond))
	return l, nil
}

// haveLayersOf makes sure the layers rec's sandbox was made from are on
// this node before it is taken over: a team template's build may have
// been made on the lost node only. Resolving the template gets its build
// here as a create would (pulled from a peer, or fetched from the blob
// store); a template rebuilt since has other layers, and then the
// sandbox's own must already be here.
func (m *Manager) haveLayersOf(ctx context.Context, rec store.Sandbox) error {
	img, err := parseImage(rec)
	if err != nil {
		return err
	}
	missing := func() string {
		for _, l := range img.Layers {
			if !m.cfg.Images.HasLayer(l) {
				return l
			}
		}
		return ""
	}
	if missing() == "" {
		return nil
	}
	if _, err := m.cfg.Resolve(ctx, rec.TeamID, rec.TemplateID); err != nil {
		return fmt.Errorf("its template %s could not be had on this node: %w", rec.TemplateID, err)
	}
	if l := missing(); l != "" {
		return fmt.Errorf("layer %s of its template %s is not on this node, nor in the template's current build (rebuilt since?)", l, rec.TemplateID)
	}
	return nil
}

// fetchPaused downloads blob d (verified) and unpacks it into home.
func (m *Manager) fetchPaused(ctx context.Context, teamID string, d blobstore.Digest, home string) error {
	tmp, err := os.MkdirTemp(m.cfg.BlobTemp, "fetch-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	pack := filepath.Join(tmp, "pack")
	start := time.Now()
	if err := m.cfg.Blobs.Get(ctx, teamID, d, pack); err != nil {
		return err
	}
	downloaded := time.Now()
	m.faultPoint("resume-after-download", filepath.Base(home))
	f, err := os.Open(pack)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := blobstore.Unpack(f, home); err != nil {
		return err
	}
	fi, _ := f.Stat()
	m.log.Debug("fetched a paused sandbox's blob", "sandbox", filepath.Base(home), "blob", d.String(), "bytes", fi.Size(),
		"download", downloaded.Sub(start).Round(time.Millisecond), "unpack", time.Since(downloaded).Round(time.Millisecond))
	return nil
}

// dropBlob removes a sandbox's blob once nothing needs it (it was resumed
// or killed); a failure leaves garbage, not a loss.
func (m *Manager) dropBlob(teamID, blob string) {
	if m.cfg.Blobs == nil || blob == "" {
		return
	}
	d, err := blobstore.ParseDigest(blob)
	if err != nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := m.cfg.Blobs.Delete(ctx, teamID, d); err != nil {
			m.log.Warn("removing a blob no sandbox needs", "blob", blob, "err", err)
		}
	}()
}

// DefaultBlobGCGrace is how old a blob no record names must be before it
// is collected: a pause under way has stored its blob and not yet
// recorded it, and a crash between the two leaves one behind.
const DefaultBlobGCGrace = time.Hour

// blobGCInterval is how often a node with a blob store collects.
const blobGCInterval = 10 * time.Minute

// collectBlobs is CollectBlobs on the manager's stores, from the
// background.
func (m *Manager) collectBlobs() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n, err := CollectBlobs(ctx, m.cfg.Store, m.cfg.Blobs, time.Now().Add(-m.cfg.BlobGCGrace))
	if err != nil {
		m.log.Warn("collecting orphaned blobs", "removed", n, "err", err)
	} else if n > 0 {
		m.log.Info("collected orphaned blobs", "removed", n)
	}
}

// CollectBlobs removes every team's blobs that no sandbox record, no
// snapshot record and no template build (nameBuildBlobs) names and that
// were stored before before; it returns how many it removed.
// Every node sharing the store may run it: removals are idempotent.
func CollectBlobs(ctx context.Context, st store.Store, blobs blobstore.Store, before time.Time) (int, error) {
	teams, err := st.ListTeams(ctx)
	if err != nil {
		return 0, err
	}
	recs, err := st.ListSandboxes(ctx, store.SandboxFilter{Teams: store.AllTeams()})
	if err != nil {
		return 0, err
	}
	named := map[string]bool{}
	for _, r := range recs {
		if r.PausedBlob != "" {
			named[r.TeamID+" "+r.PausedBlob] = true
		}
	}
	if err := namedBySnapshots(ctx, st, named, before); err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, t := range teams {
		if err := nameBuildBlobs(ctx, st, t.ID, named); err != nil {
			errs = append(errs, err)
			continue // not knowing what its templates use, remove none of its blobs
		}
		infos, err := blobs.List(ctx, t.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, info := range infos {
			if named[t.ID+" "+info.Digest.String()] || !info.Modified.Before(before) {
				continue
			}
			if err := blobs.Delete(ctx, t.ID, info.Digest); err != nil {
				errs = append(errs, err)
				continue
			}
			removed++
		}
	}
	// Parts of uploads a crash cut short (an S3 store's).
	if a, ok := blobs.(interface {
		AbortStale(context.Context, time.Time) (int, error)
	}); ok {
		n, err := a.AbortStale(ctx, before)
		removed += n
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// trimCopies bounds what the paused sandboxes stored in the blob store
// keep on this node (Config.BlobCacheMB): the copies of the least
// recently paused go first, and come back from the store at their
// resume (fetchIfEvicted). A running sandbox is never touched, nor a
// paused one whose pause or resume is under way (its lock is held): the
// trim is tried again a second later while the bound is passed. (A pause
// starts the trim as it returns, its lock still held: a trim that ran
// first skipped the sandbox just paused and, with nothing to try again,
// left the copies over the bound until the next pause.)
func (m *Manager) trimCopies(ctx context.Context) {
	if m.cfg.BlobCacheMB <= 0 {
		return
	}
	type copyOf struct {
		l     *live
		bytes int64
		at    time.Time
	}
	var copies []copyOf
	var total int64
	m.mu.Lock()
	var paused []*live
	for _, l := range m.live {
		if l.paused && l.parked.Dir != "" {
			paused = append(paused, l)
		}
	}
	m.mu.Unlock()
	for _, l := range paused {
		n, err := hostres.AllocatedBytes(l.parked.Dir)
		if err != nil || n == 0 {
			continue
		}
		copies = append(copies, copyOf{l, n, l.pausedAt})
		total += n
	}
	slices.SortFunc(copies, func(a, b copyOf) int { return a.at.Compare(b.at) })
	skipped := false
	defer func() {
		if skipped && total > int64(m.cfg.BlobCacheMB)<<20 && m.trimAgain.CompareAndSwap(false, true) {
			time.AfterFunc(time.Second, func() {
				m.trimAgain.Store(false)
				m.mu.Lock()
				closed := m.closed
				m.mu.Unlock()
				if !closed {
					m.trimCopies(ctx)
				}
			})
		}
	}()
	for _, c := range copies {
		if total <= int64(m.cfg.BlobCacheMB)<<20 {
			return
		}
		if !c.l.mu.TryLock() {
			skipped = true // a pause or resume of it is under way
			continue
		}
		rec, err := m.cfg.Store.GetSandbox(ctx, c.l.id)
		if err == nil && rec.State == store.StatePaused && rec.PausedBlob != "" && rec.Node == m.cfg.NodeName {
			if err := m.cfg.Node.DeletePaused(ctx, c.l.parked); err != nil {
				m.log.Warn("evicting a paused sandbox's copy", "sandbox", c.l.id, "err", err)
			} else {
				total -= c.bytes
				m.log.Info("evicted a paused sandbox's copy: its blob stays in the store", "sandbox", c.l.id, "bytes", c.bytes)
			}
		}
		c.l.mu.Unlock()
	}
}

// fetchIfEvicted brings back a paused sandbox's files from the blob
// store when trimCopies evicted them.
func (m *Manager) fetchIfEvicted(ctx context.Context, teamID string, rec store.Sandbox, p node.Paused) error {
	if rec.PausedBlob == "" || m.cfg.Blobs == nil {
		return nil
	}
	_, err := os.Stat(p.Dir)
	m.blobCache(err == nil)
	if err == nil {
		return nil
	}
	d, err := blobstore.ParseDigest(rec.PausedBlob)
	if err != nil {
		return err
	}
	if err := m.cfg.Node.DeletePaused(ctx, p); err != nil {
		return err
	}
	if err := m.fetchPaused(ctx, teamID, d, p.Dir); err != nil {
		_ = os.RemoveAll(p.Dir)
		return err
	}
	m.log.Info("fetched an evicted paused sandbox back from the blob store", "sandbox", rec.ID, "blob", rec.PausedBlob)
	return nil
}

// Removing a lost node's paused sandbox from the blob store.
//
// A sandbox paused into the blob store outlives its node, so it must be
// removable without it too: a kill the api hands to another node (the
// owner is lost), and the paused-retention reaper of every node, remove
// the record and the blob from the shared stores. Removal is
// conditional on the record still naming the node and blob that were
// read, so a node that took the sandbox over (resumed it) meanwhile, or
// the owner's own kill, wins and nothing is removed twice. The lost
// node, when it returns, finds no record and removes its copy at its
// start (recover.go).

// RemoveFromBlobStore removes team teamID's sandbox id, paused in the
// blob store on a node other than self: its record, then its blob (a
// failure there leaves garbage CollectBlobs removes, not a sandbox).
// ErrNotFound when there is no such sandbox of the team.
func RemoveFromBlobStore(ctx context.Context, st store.Store, blobs blobstore.Store, self, teamID, id string) error {
	notFound := fmt.Errorf("%w: %s", ErrNotFound, id)
	if blobs == nil || teamID == "" {
		return notFound
	}
	rec, err := st.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (rec.TeamID != teamID || !pausedAway(rec, self))) {
		return notFound
	}
	if err != nil {
		return err
	}
	d, err := blobstore.ParseDigest(rec.PausedBlob)
	if err != nil {
		return err
	}
	_, err = st.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		if s.TeamID != teamID || s.State != store.StatePaused || s.Node != rec.Node || s.PausedBlob != rec.PausedBlob {
			return fmt.Errorf("%w: sandbox %s changed while it was removed", ErrConflict, id)
		}
		s.State = store.StateKilled
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return notFound
	}
	if err != nil {
		return err
	}
	if err := st.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		// Killed, invisible: its node's next start forgets the record.
		return err
	}
	return blobs.Delete(ctx, teamID, d)
}

// pausedAway reports a sandbox paused in the blob store by a node other
// than self.
func pausedAway(r store.Sandbox, self string) bool {
	return r.State == store.StatePaused && r.PausedBlob != "" && r.Node != self
}

// ReapLostPaused removes the sandboxes paused in the blob store before
// cutoff whose node is lost (no heartbeat for lostAfter at now) or
// unregistered: their node's reaper cannot. It returns how many it
// removed. Every node sharing the stores may run it.
func ReapLostPaused(ctx context.Context, st store.Store, blobs blobstore.Store, self string, cutoff, now time.Time, lostAfter time.Duration) (int, error) {
	if blobs == nil {
		return 0, nil
	}
	recs, err := st.ListSandboxes(ctx, store.SandboxFilter{Teams: store.AllTeams(), States: []store.SandboxState{store.StatePaused}})
	if err != nil {
		return 0, err
	}
	ns, err := st.ListNodes(ctx)
	if err != nil {
		return 0, err
	}
	alive := map[string]bool{}
	for _, n := range ns {
		alive[n.Name] = !n.Lost(now, lostAfter)
	}
	removed := 0
	var errs []error
	for _, r := range recs {
		if !pausedAway(r, self) || alive[r.Node] || r.PausedAt.IsZero() || !r.PausedAt.Before(cutoff) {
			continue
		}
		switch err := RemoveFromBlobStore(ctx, st, blobs, self, r.TeamID, r.ID); {
		case errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict):
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", r.ID, err))
		default:
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// lostReapInterval is how often a node with a blob store reaps the lost
// nodes' paused sandboxes.
const lostReapInterval = time.Minute

// reapLostPaused is ReapLostPaused on the manager's stores, from the
// background.
func (m *Manager) reapLostPaused() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Now()
	n, err := ReapLostPaused(ctx, m.cfg.Store, m.cfg.Blobs, m.cfg.NodeName, now.Add(-m.cfg.PausedRetention), now, m.cfg.NodeLostAfter)
	if err != nil {
		m.log.Warn("removing lost nodes' sandboxes paused past the retention", "removed", n, "err", err)
	} else if n > 0 {
		m.log.Info("removed lost nodes' sandboxes paused in the blob store longer than the retention (--paused-retention)", "removed", n, "retention", m.cfg.PausedRetention)
	}
}

// BlobCacheObserver is an Observer that also counts the resumes of
// sandboxes paused in the blob store that found this node's copy (hit)
// or fetched their blob (miss).
type BlobCacheObserver interface {
	BlobCache(hit bool)
}

func (m *Manager) blobCache(hit bool) {
	if o, ok := m.cfg.Observer.(BlobCacheObserver); ok {
		o.BlobCache(hit)
	}
}

// storeUnstored finishes, after a restart, the pauses into the blob store
// that the node's end cut short (before the upload, mid-upload or before
// the record named the blob), and stores the sandboxes paused here before
// the node had a store (or while it was unreachable): each paused
// sandbox of this node with a disk image whose record names no blob is
// packed and stored again. Its pack is the same bytes as the interrupted
// one's (a pack holds no times), so an upload cut short is resumed, not
// sent again (blobstore's resumable uploads). Until it is stored the
// sandbox is paused here, resumable here, as the pause's error said.
// It runs at the start, then with the collector (every blobGCInterval).
func (m *Manager) storeUnstored() {
	m.mu.Lock()
	var paused []*live
	for _, l := range m.live {
		if l.paused {
			paused = append(paused, l)
		}
	}
	m.mu.Unlock()
	for _, l := range paused {
		select {
		case <-m.stop:
			return
		default:
		}
		m.storeIfUnstored(l)
	}
}

// storeIfUnstored is storeUnstored's work on one sandbox, under its lock
// (a resume or kill of it waits).
func (m *Manager) storeIfUnstored(l *live) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if paused, err := m.pausedNow(l); err != nil || !paused {
		return
	}
	rec, err := m.cfg.Store.GetSandbox(ctx, l.id)
	if err != nil || rec.State != store.StatePaused || rec.PausedBlob != "" || rec.Node != m.cfg.NodeName || rec.RootfsDir == "" {
		return
	}
	if _, err := os.Stat(filepath.Join(rec.RootfsDir, rootfs.DiskImageName)); err != nil {
		return // no disk limit: not packed (storePaused)
	}
	if err := m.storePaused(ctx, l.teamID, l.id, rec.RootfsDir); err != nil {
		m.log.Warn("storing a sandbox paused on this node in the blob store", "sandbox", l.id, "err", err)
		return
	}
	m.log.Info("a sandbox paused on this node only is now in the blob store too", "sandbox", l.id)
}
