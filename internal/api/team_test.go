package api

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/store"
)

// teamOfEveryKey finds every API key, in team; a stored team ID that
// team.Parse refuses stands for a damaged or hand-edited store.
type teamOfEveryKey struct {
	store.Store
	team string
}

func (f teamOfEveryKey) KeyByHash(_ context.Context, kind store.KeyKind, _ string) (store.Key, error) {
	return store.Key{ID: "k", TeamID: f.team, Kind: kind}, nil
}

// A request goes on only with a team the authentication could parse: a
// credential whose team is empty or malformed is refused (500, the store
// is wrong, not the client) before any handler, and the sandbox service
// is never asked; a sound one reaches it with its team.
func TestTheRequestsTeamIsParsedAtAuthentication(t *testing.T) {
	for _, bad := range []string{"", "a b", "../t1", strings.Repeat("t", 65)} {
		hs := newHarness(t, Config{Store: teamOfEveryKey{team: bad}})
		w := hs.do("GET", "/sandboxes/sb1", keyTeam1, "")
		if w.Code != http.StatusInternalServerError {
			t.Errorf("a key of team %q: %d %s, want 500", bad, w.Code, w.Body)
			continue
		}
		errorBody(t, w)
		if calls := hs.sandboxes.Calls(); len(calls) != 0 {
			t.Errorf("a key of team %q reached the sandbox service: %v", bad, calls)
		}
	}
	hs := newHarness(t, Config{})
	var asked string
	hs.sandboxes.get = func(teamID, id string) (store.Sandbox, error) {
		asked = teamID
		return store.Sandbox{ID: id, TeamID: teamID, State: store.StateRunning}, nil
	}
	if w := hs.do("GET", "/sandboxes/sb1", keyTeam1, ""); w.Code != http.StatusOK || asked != "t1" {
		t.Errorf("team t1's key: %d %s, the service asked for team %q", w.Code, w.Body, asked)
	}
}
