package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/filesig"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/store"
)

// trafficManager is a manager with live sandboxes and nothing under them:
// enough for the proxy's hooks, which touch only the manager's memory.
func trafficManager(ls ...*live) *Manager {
	m := &Manager{live: map[string]*live{}, log: slog.New(slog.DiscardHandler)}
	for _, l := range ls {
		m.live[l.id] = l
	}
	return m
}

func TestTrackAndEndTraffic(t *testing.T) {
	a, b := &live{id: "a"}, &live{id: "b"}
	m := trafficManager(a, b)
	ended := map[string]int{}
	end := func(what string) func() { return func() { ended[what]++ } }

	untrack1, err := m.Track("a", end("a1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Track("a", end("a2")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Track("b", end("b1")); err != nil {
		t.Fatal(err)
	}
	untrack1() // a1 ended by itself: never ended again
	m.endTraffic(a)
	if ended["a1"] != 0 || ended["a2"] != 1 || ended["b1"] != 0 {
		t.Errorf("ended %v, want only a2", ended)
	}
	m.endTraffic(a) // nothing left: nothing ended twice
	if ended["a2"] != 1 {
		t.Errorf("a2 ended %d times", ended["a2"])
	}

	// Once gone (kill) or paused, nothing registers: an exchange that
	// resolved the sandbox just before must not outlive it.
	delete(m.live, "a")
	if _, err := m.Track("a", end("late")); !errors.Is(err, proxy.ErrNotFound) {
		t.Errorf("Track of a killed sandbox: %v", err)
	}
	b.paused = true
	if _, err := m.Track("b", end("late")); !errors.Is(err, proxy.ErrTransitioning) {
		t.Errorf("Track of a paused sandbox: %v", err)
	}
	if _, err := m.Track("nosuch", end("late")); !errors.Is(err, proxy.ErrNotFound) {
		t.Errorf("Track of an unknown sandbox: %v", err)
	}
}

func TestSignedByOffersEveryResolvableToken(t *testing.T) {
	m := trafficManager(
		&live{id: "run1", envdToken: "t1"},
		&live{id: "run2", envdToken: "t2"},
		&live{id: "frozen", envdToken: "t3", paused: true},                  // not resumable: not offered
		&live{id: "wakes", envdToken: "t4", paused: true, autoResume: true}, // resumes on traffic
	)
	for _, c := range []struct{ token, want string }{{"t2", "run2"}, {"t4", "wakes"}, {"t3", ""}, {"nope", ""}} {
		offered := map[string]bool{}
		id, err := m.SignedBy(func(tok string) bool { offered[tok] = true; return tok == c.token })
		if id != c.want || (c.want == "") != errors.Is(err, proxy.ErrNotFound) {
			t.Errorf("token %s: %q %v, want %q", c.token, id, err, c.want)
		}
		if len(offered) != 3 || offered["t3"] {
			t.Errorf("token %s: offered %v, want t1, t2 and t4 whatever matched", c.token, offered)
		}
	}
}

// BenchmarkSignedByFullNode: routing one signed URL on a node at its
// default limit of 100 sandboxes: 100 signatures computed and compared.
func BenchmarkSignedByFullNode(b *testing.B) {
	var ls []*live
	for i := range 100 {
		ls = append(ls, &live{id: fmt.Sprintf("sbx%d", i), envdToken: newToken()})
	}
	m := trafficManager(ls...)
	want := ls[57].envdToken
	q := filesig.Query{Path: "/home/user/a.txt", Signature: filesig.Signature("/home/user/a.txt", filesig.Read, "", want, nil)}
	b.ResetTimer()
	for range b.N {
		if id, err := m.SignedBy(func(tok string) bool { return q.Signed(filesig.Read, tok) }); err != nil || id != "sbx57" {
			b.Fatal(id, err)
		}
	}
}

// A resume by proxy traffic takes a place in its team's limit beyond the
// node (ReserveForTeam, a cluster's store claim): at the limit the
// traffic is answered 429 in E2B's shape and the sandbox stays paused.
func TestTrafficResumeAtTheTeamLimit(t *testing.T) {
	ctx := context.Background()
	st := newStore(t) // with team t1
	now := time.Now()
	for _, rec := range []store.Sandbox{
		// Running on another node: the team's one place is taken.
		{ID: "elsewhere", TeamID: "t1", TemplateID: "base", State: store.StateRunning, Node: "other", StartedAt: now, EndAt: now.Add(time.Hour)},
		{ID: "sleeper", TeamID: "t1", TemplateID: "base", State: store.StatePaused, Node: "local", StartedAt: now, EndAt: now, PausedAt: now, AutoResume: true, EnvdAccessToken: "envd-tok"},
	} {
		if err := st.CreateSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	const limit = 1
	reserved := 0
	m := trafficManager(&live{id: "sleeper", teamID: "t1", paused: true, autoResume: true, envdToken: "envd-tok"})
	m.cfg = Config{Store: st, ReserveForTeam: storeClaims(st, limit, &reserved)}
	p := proxy.New(proxy.Config{Domain: "localhost", Resolver: m})
	r := httptest.NewRequest("GET", "/health", nil)
	r.Host = fmt.Sprintf("%d-sleeper.localhost", envdinfo.Port)
	r.Header.Set("X-Access-Token", "envd-tok")
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	var body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != http.StatusTooManyRequests || body.Code != http.StatusTooManyRequests || !strings.Contains(body.Message, "--max-sandboxes-per-team") {
		t.Fatalf("traffic to a paused sandbox of a team at its limit: %d %q", w.Code, w.Body.String())
	}
	if reserved != 1 {
		t.Errorf("the team's limit was asked %d times, want once", reserved)
	}
	if rec, err := st.GetSandbox(ctx, "sleeper"); err != nil || rec.State != store.StatePaused || !m.live["sleeper"].paused {
		t.Errorf("after the refusal: %v %v, paused in memory %v", rec.State, err, m.live["sleeper"].paused)
	}
	// No place was kept: once the other sandbox is gone there is room.
	if _, err := st.UpdateSandbox(ctx, "elsewhere", func(s *store.Sandbox) error { s.State = store.StateKilled; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSandbox(ctx, "t1", limit, time.Now().Add(time.Minute)); err != nil {
		t.Errorf("a claim once the place is free: %v", err)
	}
}

// storeClaims is a cluster node's ReserveForTeam (the server wires
// dispatch.Claimer, which this package cannot import): a place in the
// team's limit in the store, counting in asked.
func storeClaims(st store.Store, limit int, asked *int) func(context.Context, string) (func(), error) {
	return func(ctx context.Context, team string) (func(), error) {
		*asked++
		id, err := st.ClaimSandbox(ctx, team, limit, time.Now().Add(time.Minute))
		if errors.Is(err, store.ErrLimit) {
			return nil, fmt.Errorf("%w: %v", ErrTeamLimit, err)
		}
		if err != nil {
			return nil, err
		}
		return func() { st.ReleaseClaim(context.WithoutCancel(ctx), id) }, nil
	}
}

// trafficTo sends a request to a sandbox's envd through p, with its
// access token, and returns the status and body.
func trafficTo(p http.Handler, rec store.Sandbox) (int, string) {
	r := httptest.NewRequest("GET", "/health", nil)
	r.Host = fmt.Sprintf("%d-%s.localhost", envdinfo.Port, rec.ID)
	r.Header.Set("X-Access-Token", rec.EnvdAccessToken)
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}
