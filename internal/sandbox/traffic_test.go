package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/warren-sandbox/warren/internal/filesig"
	"github.com/warren-sandbox/warren/internal/proxy"
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
