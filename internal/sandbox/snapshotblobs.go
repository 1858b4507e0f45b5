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
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// Snapshots and forks that outlive their node (Config.Blobs).
//
// A snapshot (POST /sandboxes/{id}/snapshots, internal/template) is packed
// into a blob of its team as soon as it is taken (StoreSnapshot), and the
// template service records the blob beside its build
// (store.SnapshotBlob): a node that lacks the snapshot and cannot pull it
// from the node that took it (lost, or its data dir gone) fetches the
// blob, verified, and unpacks it (FetchSnapshot).
//
// A fork of a paused sandbox restores its children from the sandbox's
// pause checkpoint and a copy of its disk (snapshotPaused): the sandbox
// stays paused. When its node is lost and it is paused in the blob
// store, the node asked to fork takes it over first, as a resume does
// (adoptFromBlob), then forks it.

// StoreSnapshot packs a snapshot's directory into a blob of team teamID;
// it returns the blob's digest ("" without a blob store) and size.
func (m *Manager) StoreSnapshot(ctx context.Context, teamID, dir string) (string, int64, error) {
	if m.cfg.Blobs == nil {
		return "", 0, nil
	}
	start := time.Now()
	d, size, err := m.packToStore(ctx, teamID, "snapshot", dir)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %v", ErrBlobStore, err)
	}
	m.log.Info("snapshot stored in the blob store", "dir", filepath.Base(dir), "blob", d.String(), "bytes", size, "took", time.Since(start).Round(time.Millisecond))
	return d.String(), size, nil
}

// FetchSnapshot writes the snapshot kept as team's blob digest into dir
// (which must not exist), verified; on failure nothing is left at dir.
func (m *Manager) FetchSnapshot(ctx context.Context, teamID, digest, dir string) error {
	if m.cfg.Blobs == nil {
		return errors.New("sandbox: no blob store to fetch a snapshot from")
	}
	d, err := blobstore.ParseDigest(digest)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := m.fetchPaused(context.WithoutCancel(ctx), teamID, d, dir); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	m.log.Info("fetched a snapshot from the blob store", "dir", filepath.Base(dir), "blob", digest, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// DropSnapshotBlob removes a deleted snapshot's blob (in the background;
// a failure leaves garbage CollectBlobs removes).
func (m *Manager) DropSnapshotBlob(teamID, digest string) { m.dropBlob(teamID, digest) }

// packToStore packs dir into a temporary file while hashing it, and puts
// the file as a blob of team; what names the blob is the caller's.
func (m *Manager) packToStore(ctx context.Context, teamID, what, dir string) (blobstore.Digest, int64, error) {
	ctx = context.WithoutCancel(ctx)
	f, err := os.CreateTemp(m.cfg.BlobTemp, what+".pack-*")
	if err != nil {
		return blobstore.Digest{}, 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if err := blobstore.Pack(bw, dir); err != nil {
		return blobstore.Digest{}, 0, err
	}
	if err := bw.Flush(); err != nil {
		return blobstore.Digest{}, 0, err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return blobstore.Digest{}, 0, err
	}
	d, err := blobstore.ParseDigest(blobstore.DigestPrefix + hex.EncodeToString(h.Sum(nil)))
	if err != nil {
		return blobstore.Digest{}, 0, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return blobstore.Digest{}, 0, err
	}
	return d, size, m.cfg.Blobs.Put(ctx, teamID, d, size, f)
}

// namedBySnapshots adds the blobs the snapshots' records name to named
// (by "team digest"), for CollectBlobs. A record whose build is gone and
// that is older than before (its snapshot was deleted while the record's
// removal failed, or a crash came between the record and the build) is
// removed instead, and its blob left unnamed. An error means the names
// are not known: nothing may be collected.
func namedBySnapshots(ctx context.Context, st store.Store, named map[string]bool, before time.Time) error {
	recs, err := st.ListSnapshotBlobs(ctx)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.CreatedAt.Before(before) {
			_, err := st.GetBuild(ctx, r.BuildID)
			if errors.Is(err, store.ErrNotFound) && st.DeleteSnapshotBlob(ctx, r.TeamID, r.BuildID) == nil {
				continue
			}
		}
		named[r.TeamID+" "+r.Blob] = true
	}
	return nil
}

// checkStorable refuses the pause of a sandbox whose files the blob
// store cannot keep, before anything is done: without a disk limit its
// writable layer is a directory of the host's file system (owners,
// modes, links and overlay whiteouts), which a pack does not carry. It
// runs on.
func (m *Manager) checkStorable(l *live) error {
	if m.cfg.Blobs == nil {
		return nil
	}
	inst := m.instance(l)
	if inst == nil {
		return nil // paused already: Pause says so
	}
	if _, err := os.Stat(filepath.Join(inst.Rootfs.Home(), rootfs.DiskImageName)); err != nil {
		return fmt.Errorf("%w: sandbox %s has no disk limit (its writable layer is a directory), which this server's blob store cannot keep: it was not paused and runs on", ErrInvalid, l.id)
	}
	return nil
}

// forkSnapshot is the snapshot a fork of l restores its children from,
// written into dir: of the running sandbox (Snapshot), or made of a
// paused one's checkpoint and disk.
func (m *Manager) forkSnapshot(ctx context.Context, teamID team.ID, l *live, dir string) (Snapshot, error) {
	if paused, err := m.pausedNow(l); err != nil {
		return Snapshot{}, err
	} else if !paused {
		return m.Snapshot(ctx, teamID, l.id, dir)
	}
	return m.snapshotPaused(ctx, teamID, l, dir)
}

// snapshotPaused writes a snapshot of a paused sandbox into dir (which
// must not exist): links to (or copies of) its pause checkpoint's files
// and a copy of its disk image. The sandbox stays paused; its lock is
// held meanwhile, so that no resume changes its files.
func (m *Manager) snapshotPaused(ctx context.Context, teamID team.ID, l *live, dir string) (_ Snapshot, err error) {
	if !m.canCheckpoint() {
		return Snapshot{}, fmt.Errorf("%w: forks need checkpoints, which this node's %s runtime cannot do here (%s)",
			ErrInvalid, m.cfg.Node.Runtime().Name(), m.cfg.Node.Runtime().Capabilities().CheckpointDetail)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	paused, err := m.pausedNow(l)
	if err != nil {
		return Snapshot{}, err
	}
	if !paused {
		return Snapshot{}, fmt.Errorf("%w: sandbox %s was resumed while the fork began: fork it again", ErrConflict, l.id)
	}
	rec, err := m.cfg.Store.GetSandbox(ctx, l.id)
	if err != nil {
		return Snapshot{}, err
	}
	if !teamID.Owns(rec.TeamID) || rec.Node != m.cfg.NodeName {
		return Snapshot{}, fmt.Errorf("%w: %s", ErrNotFound, l.id)
	}
	m.mu.Lock()
	parked := l.parked
	m.mu.Unlock()
	if parked.Checkpoint == "" {
		return Snapshot{}, fmt.Errorf("%w: sandbox %s was paused without its memory, so there is no checkpoint to fork from: resume it, then fork it", ErrConflict, l.id)
	}
	img, err := parseImage(rec)
	if err != nil {
		return Snapshot{}, err
	}
	if err := m.checkpointSpace(rec.MemoryMB); err != nil {
		return Snapshot{}, err
	}
	if err := m.fetchIfEvicted(ctx, rec.TeamID, rec, parked); err != nil {
		return Snapshot{}, fmt.Errorf("sandbox: fetching paused sandbox %s back from the blob store for its fork: %w", l.id, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return Snapshot{}, fmt.Errorf("sandbox: fork snapshot dir: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := linkFiles(parked.Checkpoint, dir); err != nil {
		return Snapshot{}, fmt.Errorf("sandbox: the checkpoint of paused sandbox %s: %w", l.id, err)
	}
	if err := rootfs.CopyImage(filepath.Join(parked.Dir, rootfs.DiskImageName), filepath.Join(dir, node.SnapshotDiskName)); err != nil {
		return Snapshot{}, fmt.Errorf("sandbox: the disk of paused sandbox %s: %w", l.id, err)
	}
	var mounts []image.VolumeMount
	for _, vm := range rec.VolumeMounts {
		mounts = append(mounts, image.VolumeMount{VolumeID: vm.VolumeID, Name: vm.Name, Path: vm.Path})
	}
	return Snapshot{Sandbox: rec, Image: image.Template{
		Layers: img.Layers, User: img.User, Workdir: img.Workdir, Envs: img.Envs,
		SnapshotToken: rec.EnvdAccessToken, SnapshotDisk: true, SnapshotMounts: mounts,
	}}, nil
}

// linkFiles hard-links the regular files of src into dst (copies them
// where a link cannot be made: another file system). A checkpoint's
// files are never written once complete: a later pause writes new ones.
func linkFiles(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s holds %s, not a regular file", src, e.Name())
		}
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if err := os.Link(from, to); err == nil {
			continue
		}
		if err := rootfs.CopyImage(from, to); err != nil {
			return err
		}
	}
	return nil
}
