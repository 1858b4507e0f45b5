package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// Forking a sandbox away from its node.
//
// A fork runs where its parent is. A parent paused in the blob store
// whose node is lost is not stuck: the first node that answers takes it
// over from the store (as a resume would, internal/sandbox's
// adoptFromBlob) and forks it there, from its pause checkpoint; it stays
// paused, now on that node.

// forkNodes are the nodes a fork of a team's sandbox goes to, in turn:
// its own, or, when that is lost and the sandbox is paused in the blob
// store, those that may take it over.
func (d *Dispatcher) forkNodes(ctx context.Context, teamID team.ID, id string) ([]store.Node, error) {
	_, n, err := d.find(ctx, teamID, id)
	if err == nil {
		return []store.Node{n}, nil
	}
	_, cands, err := d.movable(ctx, teamID, id, err)
	if err != nil {
		return nil, err
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("%w: no node is ready to take over sandbox %s from the blob store (`warren nodes` shows their states)", sandbox.ErrNoCapacity, id)
	}
	return cands, nil
}

// forkOn forks on the first of cands that has the parent or can take it
// over; a node without the blob store (not found there) passes it on.
func (d *Dispatcher) forkOn(ctx context.Context, cands []store.Node, teamID team.ID, id string, timeout time.Duration, count int) ([]noderpc.ForkChild, error) {
	var err error
	for _, n := range cands {
		var children []noderpc.ForkChild
		children, err = d.client(n).Fork(ctx, teamID, id, timeout, count)
		if err == nil {
			return children, nil
		}
		if !errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, sandbox.ErrNodeUnavailable) {
			return nil, err
		}
	}
	return nil, err
}
