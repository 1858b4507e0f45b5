package template

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/store"
)

// outcomes records what the builder reports.
type outcomes struct {
	mu   sync.Mutex
	seen []string
}

func (o *outcomes) BuildFinished(d time.Duration, outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if d <= 0 {
		outcome += " with no duration"
	}
	o.seen = append(o.seen, outcome)
}

func (o *outcomes) wait(t *testing.T, want ...string) {
	t.Helper()
	var got []string
	if !poll.Within(10*time.Second, 20*time.Millisecond, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		got = slices.Clone(o.seen)
		return len(got) >= len(want)
	}) || !slices.Equal(got, want) {
		t.Fatalf("the builder reported %v, want %v", got, want)
	}
}

// The observer hears of every build's end, with its outcome: a build that
// succeeds, one whose step fails, one cancelled by deleting its template.
func TestObserverHearsEveryBuildsEnd(t *testing.T) {
	var seen outcomes
	var removed []string // what the delete tells of (the sandbox manager's pools hear it)
	e := newEnv(t, newStore(t), func(c *Config) {
		c.Observer = &seen
		c.ImageRemoved = func(id string) { removed = append(removed, id) }
	})
	ctx := context.Background()
	if _, st := e.build("fine", buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{{Type: "ENV", Args: []string{"A", "b"}}}}); st.Build.Status != store.BuildReady {
		t.Fatalf("status %s: %s", st.Build.Status, st.Build.ReasonMessage)
	}
	seen.wait(t, "ok")
	if _, st := e.build("failing", buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{{Type: "RUN", Args: []string{"exit 3"}}}}); st.Build.Status != store.BuildError {
		t.Fatalf("status %s", st.Build.Status)
	}
	seen.wait(t, "ok", "error")

	c, err := e.b.Create(ctx, CreateRequest{TeamID: "t1", Name: "slow"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.StartBuild(ctx, "t1", c.Template.ID, c.BuildID, buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{{Type: "RUN", Args: []string{"sleep 600"}}}}); err != nil {
		t.Fatal(err)
	}
	if !poll.Within(30*time.Second, 50*time.Millisecond, func() bool { return strings.Contains(e.messages(c.BuildID), "RUN sleep") }) {
		t.Fatal("the build did not start")
	}
	if err := e.b.Delete(ctx, "t1", "slow"); err != nil {
		t.Fatal(err)
	}
	seen.wait(t, "ok", "error", "canceled")
	if len(removed) != 1 || removed[0] != c.BuildID {
		t.Errorf("the delete told of removed images %v, want its build %s", removed, c.BuildID)
	}
	e.assertNothingLeft()
}
