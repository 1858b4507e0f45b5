package noderpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// Teams tells whether a team exists. A node believes nothing of a call
// but what the api proved: the cluster's authentication proves the call
// came from an api, and the team it names must at least exist, so that
// a call naming no team (or one made up) reaches no sandbox manager
// method, whose lookups an empty team would otherwise be asked to scope.
type Teams interface {
	TeamExists(ctx context.Context, id string) (bool, error)
}

// StoreTeams is Teams over the cluster's store. Teams found are
// remembered for a while (bounded in number), so that the calls of a
// busy team cost no store read each; a team not found is asked again
// every time.
type StoreTeams struct {
	Store interface {
		GetTeam(ctx context.Context, id string) (store.Team, error)
	}

	mu    sync.Mutex
	known map[string]time.Time // team ID → when it was found
}

// Bounds of StoreTeams' memory: how long a team found is believed
// without a read, and how many are remembered at once.
const (
	teamsTTL      = time.Minute
	teamsRemember = 4096
)

// TeamExists reads the team from the store unless it was found lately.
func (t *StoreTeams) TeamExists(ctx context.Context, id string) (bool, error) {
	if id == "" {
		return false, nil
	}
	now := time.Now()
	t.mu.Lock()
	at, ok := t.known[id]
	t.mu.Unlock()
	if ok && now.Sub(at) < teamsTTL {
		return true, nil
	}
	_, err := t.Store.GetTeam(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	t.mu.Lock()
	if t.known == nil || len(t.known) >= teamsRemember {
		t.known = map[string]time.Time{}
	}
	t.known[id] = now
	t.mu.Unlock()
	return true, nil
}

// teamed is every NodeService request: each names its team.
type teamed interface{ GetTeamId() string }

// teamOf is the team a call names, as the sandbox manager takes it: the
// node's edge, where an empty or malformed team ID is refused (invalid).
func teamOf(m teamed) (team.ID, error) {
	t, err := team.Parse(m.GetTeamId())
	if err != nil {
		return team.ID{}, toConnect(sandboxInvalid("the call's team: " + err.Error()))
	}
	return t, nil
}

// teamGuard refuses a call that names no team or a malformed one
// (invalid) or a team that does not exist (not found, as another team's
// sandbox is), before the handler decodes anything else of it. Without
// teams it refuses every call: a node that cannot check a team trusts
// none.
func teamGuard(teams Teams) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			m, ok := req.Any().(teamed)
			if !ok || m.GetTeamId() == "" {
				return nil, toConnect(sandboxInvalid("the call names no team"))
			}
			if _, err := teamOf(m); err != nil {
				return nil, err
			}
			if teams == nil {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("this node cannot check teams"))
			}
			id := m.GetTeamId()
			exists, err := teams.TeamExists(ctx, id)
			if err != nil {
				return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("checking team %q: %w", id, err))
			}
			if !exists {
				return nil, toConnect(fmt.Errorf("%w: team %q", sandbox.ErrNotFound, id))
			}
			return next(ctx, req)
		}
	}
}
