package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// Places in a team's limit (--max-sandboxes-per-team) across api
// replicas. Whatever makes a sandbox run — a create, a resume, a connect
// that resumes, each child of a fork — first claims a place in the store
// (store.ClaimSandbox: the count of the team's running sandboxes and of
// every replica's unexpired claims, and the new claim, are one
// transaction), and gives it back once the node has answered: by then
// what it started runs and counts for itself. A node's own resumes on
// traffic claim the same way (Claimer, wired in sandbox.Config).

// ClaimTTL is how long a place in a team's limit outlives an api process
// that died while its create was under way. A create that takes longer
// (a template pull of many minutes) no longer holds its place once the
// claim expires; the node's own --max-sandboxes-per-team still bounds the
// team there.
const ClaimTTL = 15 * time.Minute

// Claimer returns what takes a place in a team's limit of limit sandboxes
// in st, and gives back a function that returns it: a full team is
// sandbox.ErrTeamLimit, an unknown or empty one sandbox.ErrInvalid.
func Claimer(st store.ClaimStore, limit int, now func() time.Time, log *slog.Logger) func(ctx context.Context, team string) (release func(), err error) {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(ctx context.Context, team string) (func(), error) {
		id, err := st.ClaimSandbox(ctx, team, limit, now().Add(ClaimTTL))
		var over *store.LimitError
		switch {
		case errors.As(err, &over):
			return nil, fmt.Errorf("%w: the team has %d sandboxes running or starting, its most (--max-sandboxes-per-team)", sandbox.ErrTeamLimit, over.Have)
		case errors.Is(err, store.ErrNotFound):
			return nil, fmt.Errorf("%w: no such team", sandbox.ErrInvalid)
		case err != nil:
			return nil, err
		}
		return func() {
			// Given back whether or not the caller's context lasted.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := st.ReleaseClaim(ctx, id); err != nil {
				log.WarnContext(ctx, "giving back a place in a team's sandbox limit failed; it expires by itself", "team", team, "err", err, "expires_in", ClaimTTL)
			}
		}, nil
	}
}

// admit takes a place in teamID's limit for one sandbox about to run (none
// without a limit) and returns what gives it back.
func (d *Dispatcher) admit(ctx context.Context, teamID team.ID) (release func(), err error) {
	if d.cfg.MaxPerTeam <= 0 {
		return func() {}, nil
	}
	return Claimer(d.cfg.Store, d.cfg.MaxPerTeam, d.cfg.Now, d.log)(ctx, teamID.String())
}

// admitN takes up to n places in teamID's limit, as many as it has room
// for: got of them (at least one, else the limit's error), and over, the
// error of the places it did not get (nil when it got n).
func (d *Dispatcher) admitN(ctx context.Context, teamID team.ID, n int) (got int, release func(), over, err error) {
	var releases []func()
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	for len(releases) < n {
		r, err := d.admit(ctx, teamID)
		if errors.Is(err, sandbox.ErrTeamLimit) && len(releases) > 0 {
			return len(releases), release, err, nil
		}
		if err != nil {
			release()
			return 0, nil, nil, err
		}
		releases = append(releases, r)
	}
	return n, release, nil, nil
}

// connectRunning connects to a running sandbox without a place in its
// team's limit (full: the limit's error): it extends the sandbox's term
// as a connect does (Refresh), which never resumes, and answers full if
// the sandbox is, or was meanwhile, paused.
func (d *Dispatcher) connectRunning(ctx context.Context, c *noderpc.Client, teamID team.ID, rec store.Sandbox, timeout time.Duration, full error) (store.Sandbox, error) {
	if rec.State != store.StateRunning {
		return store.Sandbox{}, full
	}
	if err := c.Refresh(ctx, teamID, rec.ID, timeout); err != nil {
		return store.Sandbox{}, err
	}
	now, err := d.cfg.Store.GetSandbox(ctx, rec.ID)
	if err != nil || !teamID.Owns(now.TeamID) || !visible(now.State) {
		return store.Sandbox{}, fmt.Errorf("%w: %s", sandbox.ErrNotFound, rec.ID)
	}
	if now.State != store.StateRunning {
		return store.Sandbox{}, full
	}
	return now, nil
}
