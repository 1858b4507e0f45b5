package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// replicas2 is two api replicas over c's store and nodes, with a team
// limit, and the nodes' resumes and forks held at a gate.
func replicas2(t *testing.T, c *cluster2, limit int) ([]*Dispatcher, chan struct{}) {
	t.Helper()
	gate := make(chan struct{})
	for _, f := range c.nodes {
		f.gate = gate
	}
	cfg := c.d.cfg
	cfg.MaxPerTeam = limit
	var ds []*Dispatcher
	for range 2 {
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	return ds, gate
}

// seed stores team's sandboxes on c's nodes, alternately: running ones,
// then paused ones (autoResume), and returns their IDs.
func seed(t *testing.T, c *cluster2, team string, running, paused int) (run, pau []string) {
	t.Helper()
	for i := range running + paused {
		node := []string{"na", "nb"}[i%2]
		rec := store.Sandbox{ID: fmt.Sprintf("%s-%s-%d", team, node, i), TeamID: team, TemplateID: "base", State: store.StateRunning,
			Node: node, StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour), EnvdAccessToken: fmt.Sprint("tok", i)}
		if i >= running {
			rec.State, rec.PausedAt, rec.AutoResume = store.StatePaused, time.Now(), true
		}
		if err := c.st.CreateSandbox(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		if i < running {
			run = append(run, rec.ID)
		} else {
			pau = append(pau, rec.ID)
		}
	}
	return run, pau
}

// running counts team's running sandboxes in the store.
func running(t *testing.T, c *cluster2, team string) int {
	t.Helper()
	rs, err := c.st.ListSandboxes(context.Background(), store.SandboxFilter{Teams: store.ForTeam(team), States: []store.SandboxState{store.StateRunning}})
	if err != nil {
		t.Fatal(err)
	}
	return len(rs)
}

// untilSettled waits until n calls have either been answered or wait at
// the nodes' gate, then opens it.
func untilSettled(t *testing.T, c *cluster2, gate chan struct{}, n int, answered func() int) {
	t.Helper()
	held := func() int {
		h := 0
		for _, f := range c.nodes {
			f.mu.Lock()
			h += f.held
			f.mu.Unlock()
		}
		return h
	}
	for deadline := time.Now().Add(5 * time.Second); answered()+held() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d answered, %d held at the nodes, want %d in all", answered(), held(), n)
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
}

// Resumes and connects that resume, through two replicas at once, take
// places in the team's limit as creates do: never more running than it.
func TestResumesHoldTheTeamLimitAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	const limit = 3
	ds, gate := replicas2(t, c, limit)
	run, paused := seed(t, c, "t1", 1, 8)
	var wg sync.WaitGroup
	var mu sync.Mutex
	resumed, refused := 0, 0
	answered := func() int { mu.Lock(); defer mu.Unlock(); return resumed + refused }
	for i, id := range paused {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if i%2 == 0 {
				_, err = ds[i%4/2].ResumeSandbox(ctx, team.MustParse("t1"), id, sandbox.ResumeOptions{Timeout: time.Minute})
			} else {
				var woke bool
				_, woke, err = ds[i%4/2].Connect(ctx, team.MustParse("t1"), id, time.Minute, true)
				if err == nil && !woke {
					err = fmt.Errorf("connect to paused %s did not resume it", id)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				resumed++
			case errors.Is(err, sandbox.ErrTeamLimit):
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	untilSettled(t, c, gate, len(paused), answered)
	wg.Wait()
	if n := running(t, c, "t1"); n > limit || resumed != limit-len(run) {
		t.Fatalf("%d resumes at once with %d of %d running: %d resumed, %d refused, %d now running", len(paused), len(run), limit, resumed, refused, n)
	}
	// At the limit a connect to a running sandbox still answers (it
	// resumes nothing), and a resume of a running one is a conflict.
	if rec, woke, err := ds[0].Connect(ctx, team.MustParse("t1"), run[0], time.Minute, true); err != nil || woke || rec.ID != run[0] {
		t.Errorf("connect to a running sandbox at the limit: %v %v %v", rec.ID, woke, err)
	}
	if _, err := ds[1].ResumeSandbox(ctx, team.MustParse("t1"), run[0], sandbox.ResumeOptions{Timeout: time.Minute}); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("resume of a running sandbox at the limit: %v", err)
	}
	// Another team's sandbox is not the team's business.
	if _, err := ds[0].ResumeSandbox(ctx, team.MustParse("t2"), paused[0], sandbox.ResumeOptions{Timeout: time.Minute}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("another team's resume: %v", err)
	}
	// A place freed is a place to resume into; the claims were given back.
	var still string
	for _, id := range paused {
		if rec, _ := c.st.GetSandbox(ctx, id); rec.State == store.StatePaused {
			still = id
			break
		}
	}
	if _, err := c.st.UpdateSandbox(ctx, run[0], func(s *store.Sandbox) error { s.State = store.StateKilled; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, woke, err := ds[1].Connect(ctx, team.MustParse("t1"), still, time.Minute, true); err != nil || !woke {
		t.Errorf("a connect that resumes into a freed place: %v %v", woke, err)
	}
}

// Forks through two replicas at once start no more children than the
// team's limit leaves room for; the others fail as a create would.
func TestForksHoldTheTeamLimitAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	const limit, count = 5, 3
	ds, gate := replicas2(t, c, limit)
	run, _ := seed(t, c, "t1", 2, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	made, limited, calls := 0, 0, 0
	const forks = 4
	for i := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := ds[i%2].Fork(ctx, team.MustParse("t1"), run[i%2], time.Minute, count)
			mu.Lock()
			defer mu.Unlock()
			calls++
			switch {
			case errors.Is(err, sandbox.ErrTeamLimit):
				limited += count
			case err != nil:
				t.Error(err)
			}
			if err == nil && len(res) != count {
				t.Errorf("a fork of %d answered %d children", count, len(res))
			}
			for _, r := range res {
				switch {
				case r.Err == nil:
					made++
				case errors.Is(r.Err, sandbox.ErrTeamLimit):
					limited++
				default:
					t.Error(r.Err)
				}
			}
		}()
	}
	// A fork refused has answered; one admitted waits at its node.
	untilSettled(t, c, gate, forks, func() int { mu.Lock(); defer mu.Unlock(); return calls })
	wg.Wait()
	if n := running(t, c, "t1"); n > limit || made != limit-len(run) || limited != forks*count-made {
		t.Fatalf("%d forks of %d at once with %d of %d running: %d children made, %d refused, %d now running", forks, count, len(run), limit, made, limited, n)
	}
}
