package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// A sandbox's clientID is the node it runs on (in a cluster, whichever api
// process answers), else the server's ClientID.
func TestClientIDIsTheSandboxesNode(t *testing.T) {
	hs := newHarness(t, Config{ClientID: "api"})
	node := "na"
	hs.sandboxes.get = func(teamID, id string) (store.Sandbox, error) {
		return store.Sandbox{ID: id, TeamID: teamID, State: store.StateRunning, Node: node, StartedAt: time.Now(), EndAt: time.Now().Add(time.Minute)}, nil
	}
	for want, n := range map[string]string{"na": "na", "api": ""} {
		node = n
		w := hs.do("GET", "/sandboxes/sb1", keyTeam1, "")
		var got struct {
			ClientID string `json:"clientID"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &got); w.Code != 200 || err != nil || got.ClientID != want {
			t.Errorf("node %q: %d %s, want clientID %q", n, w.Code, w.Body, want)
		}
	}
}
