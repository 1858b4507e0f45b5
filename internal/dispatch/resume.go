package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// Resuming a sandbox away from its node.
//
// A sandbox paused with a blob store (its record names its blob,
// PausedBlob) is not pinned to the node that paused it: when that node is
// lost, any node that shares the store resumes it (internal/sandbox's
// blobs.go fetches and verifies the blob and takes the record over).
// Placement takes the nodes in their order for a create; the paused
// sandbox's own node, while it lives, is asked first (it has the files
// already), and the others only when it has no room.

// inBlobStore reports a paused sandbox any node may resume.
func inBlobStore(r store.Sandbox) bool {
	return r.State == store.StatePaused && r.PausedBlob != ""
}

// movable is a team's paused sandbox kept in the blob store, whose node
// find refused with findErr (lost), and the nodes that may resume it, in
// placement order. Otherwise it returns findErr.
func (d *Dispatcher) movable(ctx context.Context, teamID team.ID, id string, findErr error) (store.Sandbox, []store.Node, error) {
	if teamID.IsZero() || !errors.Is(findErr, sandbox.ErrNotFound) {
		return store.Sandbox{}, nil, findErr
	}
	rec, err := d.cfg.Store.GetSandbox(ctx, id)
	if err != nil || !teamID.Owns(rec.TeamID) || !inBlobStore(rec) {
		return store.Sandbox{}, nil, findErr
	}
	ns, err := d.nodeList(ctx)
	if err != nil {
		return store.Sandbox{}, nil, err
	}
	d.mu.Lock()
	cands := order(ns, d.cfg.Now(), d.cfg.LostAfter, d.pendingLocked)
	d.mu.Unlock()
	return rec, cands, nil
}

// resumeOn calls resume on each candidate in turn until one takes the
// sandbox; a node without room passes it on.
func (d *Dispatcher) resumeOn(ctx context.Context, rec store.Sandbox, cands []store.Node, resume func(*noderpc.Client) error) error {
	if len(cands) == 0 {
		return fmt.Errorf("%w: no node is ready to resume sandbox %s (`warren nodes` shows their states)", sandbox.ErrNoCapacity, rec.ID)
	}
	var refusals []string
	var notFound error
	for _, n := range cands {
		err := resume(d.client(n))
		if err == nil {
			d.forget(rec.ID)
			d.log.InfoContext(ctx, "dispatch: resumed a sandbox away from its node", "sandbox", rec.ID, "from", rec.Node, "on", n.Name)
			return nil
		}
		switch {
		case errors.Is(err, sandbox.ErrNotFound):
			// A node without the blob store, or one that holds a stale
			// copy: the next may take it.
			notFound = err
		case !errors.Is(err, sandbox.ErrNoCapacity) && !errors.Is(err, sandbox.ErrNodeUnavailable):
			return err
		}
		refusals = append(refusals, n.Name+": "+err.Error())
	}
	if notFound != nil && len(refusals) == 1 {
		return notFound
	}
	return fmt.Errorf("%w: no node can resume sandbox %s now (%s)", sandbox.ErrNoCapacity, rec.ID, strings.Join(refusals, "; "))
}

// others are the ready nodes but name, in placement order.
func (d *Dispatcher) others(ctx context.Context, name string) []store.Node {
	ns, err := d.nodeList(ctx)
	if err != nil {
		return nil
	}
	d.mu.Lock()
	cands := order(ns, d.cfg.Now(), d.cfg.LostAfter, d.pendingLocked)
	d.mu.Unlock()
	out := cands[:0]
	for _, n := range cands {
		if n.Name != name {
			out = append(out, n)
		}
	}
	return out
}

// killAway has the first candidate that answers remove a sandbox paused
// in the blob store by a lost node (its record and blob: the node's
// sandbox.RemoveFromBlobStore); a node without the blob store passes it
// on.
func (d *Dispatcher) killAway(ctx context.Context, teamID team.ID, rec store.Sandbox, cands []store.Node) error {
	err := fmt.Errorf("%w: no node is ready to remove sandbox %s from the blob store (`warren nodes` shows their states)", sandbox.ErrNodeUnavailable, rec.ID)
	for _, n := range cands {
		err = d.client(n).Kill(ctx, teamID, rec.ID)
		if err == nil {
			d.forget(rec.ID)
			d.log.InfoContext(ctx, "dispatch: killed a sandbox paused in the blob store by a lost node", "sandbox", rec.ID, "node", rec.Node, "by", n.Name)
			return nil
		}
		if !errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, sandbox.ErrNodeUnavailable) {
			return err
		}
	}
	return err
}
