package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/api"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

var _ api.Counter = (*Dispatcher)(nil)

// CountSandboxes counts what List returns: a team's own, by state, and
// none of a lost node's.
func TestCountMatchesList(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	for range 4 {
		if _, err := c.d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base", Timeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t2"), TemplateID: "base", Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	check := func(tm team.ID, f store.SandboxFilter, want int) {
		t.Helper()
		recs, err := c.d.List(ctx, tm, f)
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.d.CountSandboxes(ctx, tm, f)
		if err != nil || n != want || len(recs) != want {
			t.Errorf("team %q %+v: count %d (%v), list %d, want %d", tm, f, n, err, len(recs), want)
		}
	}
	running := store.SandboxFilter{States: []store.SandboxState{store.StateRunning}}
	check(team.MustParse("t1"), running, 4)
	check(team.MustParse("t2"), running, 1)
	check(team.ID{}, running, 0)
	check(team.MustParse("t1"), store.SandboxFilter{States: []store.SandboxState{store.StatePaused}}, 0)
	// nb stops heartbeating: its sandboxes leave both.
	if _, err := c.st.HeartbeatNode(ctx, "na", c.now.Add(time.Minute), store.NodeUsage{}); err != nil {
		t.Fatal(err)
	}
	c.later(time.Minute)
	check(team.MustParse("t1"), running, 2)
}
