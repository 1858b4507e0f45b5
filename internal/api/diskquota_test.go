package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/store"
)

// quotaStore answers teams' disk usage.
type quotaStore struct {
	fakeStore
	usage map[string]store.TeamDisk
	err   error
}

func (q quotaStore) TeamDiskUsage(_ context.Context, teamID string) (store.TeamDisk, error) {
	if teamID == "" {
		return store.TeamDisk{}, errors.New("no team")
	}
	return q.usage[teamID], q.err
}

// What would add to a team's disk at or over its quota is refused with
// 507 and the figures; what fits goes on; an unreadable usage fails
// closed.
func TestTeamDiskQuota(t *testing.T) {
	const gb = 1 << 30
	st := quotaStore{usage: map[string]store.TeamDisk{
		"t1": {Volumes: 40 * gb, Paused: 9 * gb, Templates: gb, Snapshots: gb / 10}, // 50.1 GB
		"t2": {Volumes: 45 * gb},
	}}
	hs, _ := volumeHarness(t, Config{Store: st, TeamDiskQuotaMB: 51200, VolumeQuotaMB: 10240})
	refused := []struct{ method, path, body string }{
		{"POST", "/volumes", `{"name":"more"}`},
		{"POST", "/sandboxes/sbx1/pause", ``},
		{"POST", "/sandboxes/sbx1/snapshots", `{}`},
		{"POST", "/v2/templates/tpl1/builds/b1", `{"fromTemplate":"base"}`},
		{"POST", "/templates/tpl1", `{"dockerfile":"FROM base"}`},
	}
	for _, r := range refused {
		w := hs.do(r.method, r.path, keyTeam1, r.body)
		code, msg := errorBody(t, w)
		if code != http.StatusInsufficientStorage || !strings.Contains(msg, "team disk quota exceeded: 50.1 GB used of 50 GB") {
			t.Errorf("%s %s over the quota: %d %q", r.method, r.path, code, msg)
		}
	}
	if c := append(hs.sandboxes.Calls(), hs.templates.Calls()...); len(c) != 0 {
		t.Errorf("made something over the quota: %v", c)
	}
	// 45 GB used: a 10 GB volume does not fit, a pause does.
	w := hs.do("POST", "/volumes", keyTeam2, `{"name":"more"}`)
	if code, msg := errorBody(t, w); code != http.StatusInsufficientStorage || !strings.Contains(msg, "45 GB used of 50 GB") || !strings.Contains(msg, "10 GB") {
		t.Errorf("a 10 GB volume with 45 GB of 50 used: %d %q", code, msg)
	}
	if w := hs.do("POST", "/sandboxes/sbx1/pause", keyTeam2, ``); w.Code >= 300 {
		t.Errorf("a pause under the quota: %d %s", w.Code, w.Body)
	}
	st.err = errors.New("the database is down")
	hs2, _ := volumeHarness(t, Config{Store: st, TeamDiskQuotaMB: 51200, VolumeQuotaMB: 10240})
	if w := hs2.do("POST", "/sandboxes/sbx1/pause", keyTeam2, ``); w.Code != http.StatusInternalServerError {
		t.Errorf("usage unreadable: %d (must fail closed)", w.Code)
	}
}
