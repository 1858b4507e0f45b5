package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// fakeSealer "seals" by prefixing the context: enough to check that the
// dispatcher opens with the webhook's own context.
type fakeSealer struct{}

func (fakeSealer) Seal(v, c string) (string, error) { return c + "|" + v, nil }
func (fakeSealer) Open(s, c string) (string, error) {
	v, ok := strings.CutPrefix(s, c+"|")
	if !ok {
		return "", errors.New("wrong context")
	}
	return v, nil
}

// got is what a test receiver recorded of one request.
type got struct {
	webhookID, deliveryID, version, signature string
	body                                      []byte
	id, typ, sandbox                          string
}

// sink is a loopback receiver that records requests and answers with
// what answer says.
type sink struct {
	*receiver
	mu     sync.Mutex
	got    []got
	answer func(n int) int
	ch     chan got
}

func newSink(t *testing.T, answer func(n int) int) *sink {
	s := &sink{answer: answer, ch: make(chan got, 100)}
	s.receiver = newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev struct{ ID, Type, SandboxID string }
		json.Unmarshal(body, &ev)
		g := got{r.Header.Get(HeaderWebhookID), r.Header.Get(HeaderDeliveryID), r.Header.Get(HeaderSignatureVersion),
			r.Header.Get(HeaderSignature), body, ev.ID, ev.Type, ev.SandboxID}
		s.mu.Lock()
		s.got = append(s.got, g)
		n := len(s.got)
		s.mu.Unlock()
		w.WriteHeader(s.answer(n))
		s.ch <- g
	})
	return s
}

func (s *sink) wait(t *testing.T, n int) []got {
	t.Helper()
	var out []got
	for len(out) < n {
		select {
		case g := <-s.ch:
			out = append(out, g)
		case <-time.After(20 * time.Second):
			t.Fatalf("got %d of %d deliveries", len(out), n)
		}
	}
	return out
}

type world struct {
	st  store.Store
	svc *Service
}

func newWorld(t *testing.T, path string) world {
	t.Helper()
	st, err := store.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return world{st: st, svc: &Service{Store: st, Sealer: fakeSealer{}, Guard: loopGuard()}}
}

func loopGuard() *Guard { return &Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}} }

func (w world) dispatcher(owner string) *Dispatcher {
	return NewDispatcher(DispatcherConfig{Store: w.st, Sealer: fakeSealer{}, Owner: owner,
		Sender:  &Sender{Guard: loopGuard(), Timeout: 5 * time.Second},
		Retries: 3, RetryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, LeaseTTL: 5 * time.Second})
}

func run(t *testing.T, d *Dispatcher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (w world) hook(t *testing.T, team, url string, events ...string) store.Webhook {
	t.Helper()
	if len(events) == 0 {
		events = store.EventTypes
	}
	secret := "secret-of-" + url
	h, err := w.svc.Create(context.Background(), team, Spec{Name: ptr("h"), URL: &url, Events: &events, Secret: &secret})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func ptr[T any](v T) *T { return &v }

// lifecycle takes a new sandbox of team through created, updated,
// paused, resumed and killed.
func (w world) lifecycle(t *testing.T, team, id string) {
	t.Helper()
	ctx := context.Background()
	if err := w.st.CreateSandbox(ctx, store.Sandbox{ID: id, TeamID: team, TemplateID: "base", State: store.StateCreating}); err != nil {
		t.Fatal(err)
	}
	for _, change := range []func(*store.Sandbox){
		func(s *store.Sandbox) { s.State, s.StartedAt = store.StateRunning, time.Now() },
		func(s *store.Sandbox) { s.EndAt = time.Now().Add(time.Hour) },
		func(s *store.Sandbox) { s.State = store.StatePaused },
		func(s *store.Sandbox) { s.State = store.StateRunning },
		func(s *store.Sandbox) { s.State = store.StateKilled },
	} {
		if _, err := w.st.UpdateSandbox(ctx, id, func(s *store.Sandbox) error { change(s); return nil }); err != nil {
			t.Fatal(err)
		}
	}
}

var lifecycleTypes = []string{store.EventCreated, store.EventUpdated, store.EventPaused, store.EventResumed, store.EventKilled}

func newTeam(t *testing.T, st store.Store, id string) {
	if err := st.CreateTeam(context.Background(), store.Team{ID: id, Name: id, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// TestDispatcherDeliversSignedInOrder: every event, signed with the
// webhook's secret, E2B's headers, in order; a 500 is retried with the
// same event ID (a new delivery ID); attempts are listed.
func TestDispatcherDeliversSignedInOrder(t *testing.T) {
	w := newWorld(t, filepath.Join(t.TempDir(), "warren.db"))
	newTeam(t, w.st, "team1")
	rcv := newSink(t, func(n int) int {
		if n == 2 {
			return http.StatusInternalServerError // the second request (first updated) fails once
		}
		return http.StatusOK
	})
	h := w.hook(t, "team1", rcv.URL)
	run(t, w.dispatcher("p1"))
	w.lifecycle(t, "team1", "sb1")
	gs := rcv.wait(t, 6)
	var types []string
	for i, g := range gs {
		if g.webhookID != h.ID || g.version != "v1" || g.deliveryID == "" || g.sandbox != "sb1" {
			t.Errorf("request %d headers/body: %+v", i, g)
		}
		if g.signature != Sign("secret-of-"+rcv.URL, g.body) {
			t.Errorf("request %d: bad signature", i)
		}
		if i != 1 { // the retry repeats the failed one
			types = append(types, g.typ)
		}
	}
	if strings.Join(types, ",") != strings.Join(lifecycleTypes, ",") {
		t.Errorf("types in order = %v", types)
	}
	if gs[1].id != gs[2].id || gs[1].deliveryID == gs[2].deliveryID {
		t.Errorf("retry: event %s→%s, delivery %s→%s", gs[1].id, gs[2].id, gs[1].deliveryID, gs[2].deliveryID)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		as, err := w.svc.Attempts(context.Background(), "team1", h.ID, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(as) == 6 {
			// Attempts made within one millisecond list in either order:
			// the one that failed is found by its status.
			var failed []string
			for _, a := range as {
				if a.Status != 200 {
					failed = append(failed, fmt.Sprintf("%+v", a))
					if a.Status != 500 || a.Error == "" || a.Attempt != 1 || a.EventID != gs[1].id {
						t.Errorf("failed attempt = %+v", a)
					}
				}
			}
			if len(failed) != 1 {
				t.Errorf("attempts that failed: %v, want the one 500", failed)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d attempts listed", len(as))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := w.svc.Attempts(context.Background(), "team2", h.ID, 10); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team's attempts: %v", err)
	}
}

// TestDispatcherGivesUp after the retries, and the next event follows.
func TestDispatcherGivesUp(t *testing.T) {
	w := newWorld(t, filepath.Join(t.TempDir(), "warren.db"))
	newTeam(t, w.st, "team1")
	rcv := newSink(t, func(n int) int {
		if n <= 4 {
			return http.StatusBadGateway
		}
		return http.StatusOK
	})
	w.hook(t, "team1", rcv.URL, store.EventCreated, store.EventKilled)
	run(t, w.dispatcher("p1"))
	w.lifecycle(t, "team1", "sb1")
	gs := rcv.wait(t, 5)
	for i := range 4 {
		if gs[i].typ != store.EventCreated || gs[i].id != gs[0].id {
			t.Errorf("attempt %d: %s %s", i, gs[i].typ, gs[i].id)
		}
	}
	if gs[4].typ != store.EventKilled {
		t.Errorf("after giving up: %s", gs[4].typ)
	}
}

// TestDispatcherSkipsDisabledAndDeleted, and other teams' webhooks.
func TestDispatcherSkipsDisabledAndDeleted(t *testing.T) {
	w := newWorld(t, filepath.Join(t.TempDir(), "warren.db"))
	newTeam(t, w.st, "team1")
	newTeam(t, w.st, "team2")
	on := newSink(t, func(int) int { return 200 })
	off := newSink(t, func(int) int { return 200 })
	gone := newSink(t, func(int) int { return 200 })
	other := newSink(t, func(int) int { return 200 })
	w.hook(t, "team1", on.URL)
	hoff := w.hook(t, "team1", off.URL)
	hgone := w.hook(t, "team1", gone.URL)
	w.hook(t, "team2", other.URL)
	if _, err := w.svc.Update(context.Background(), "team1", hoff.ID, Spec{Enabled: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	if err := w.svc.Delete(context.Background(), "team1", hgone.ID); err != nil {
		t.Fatal(err)
	}
	run(t, w.dispatcher("p1"))
	w.lifecycle(t, "team1", "sb1")
	on.wait(t, 5)
	time.Sleep(200 * time.Millisecond) // 20 polls: nothing else is on its way
	for name, s := range map[string]*sink{"disabled": off, "deleted": gone, "other team's": other} {
		if n := s.hits.Load(); n != 0 {
			t.Errorf("the %s webhook got %d requests", name, n)
		}
	}
}

// TestSlowEndpointDelaysNoOther: while one endpoint holds its attempt,
// another webhook's deliveries go on.
func TestSlowEndpointDelaysNoOther(t *testing.T) {
	w := newWorld(t, filepath.Join(t.TempDir(), "warren.db"))
	newTeam(t, w.st, "team1")
	newTeam(t, w.st, "team2")
	release := make(chan struct{})
	slow := newReceiver(t, func(http.ResponseWriter, *http.Request) { <-release })
	t.Cleanup(func() { close(release) })
	fast := newSink(t, func(int) int { return 200 })
	w.hook(t, "team1", slow.URL)
	w.hook(t, "team2", fast.URL)
	run(t, w.dispatcher("p1"))
	w.lifecycle(t, "team1", "sb1")
	w.lifecycle(t, "team2", "sb2")
	// The slow endpoint's first attempt is under way (and hangs), on a
	// loaded machine perhaps only after the fast one was served: what
	// matters is that the fast one gets everything while it hangs.
	for end := time.Now().Add(10 * time.Second); slow.hits.Load() == 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	fast.wait(t, 5) // all of them, while the slow one's first attempt hangs
	if n := slow.hits.Load(); n != 1 {
		t.Errorf("the slow endpoint got %d requests, want its first, still open", n)
	}
}

// TestTwoProcessesDeliverOnce: two dispatchers on one database (two
// processes of a cluster) deliver each event once.
func TestTwoProcessesDeliverOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "warren.db")
	w1, w2 := newWorld(t, path), newWorld(t, path)
	newTeam(t, w1.st, "team1")
	rcv := newSink(t, func(int) int { return 200 })
	w1.hook(t, "team1", rcv.URL)
	w1.hook(t, "team1", rcv.URL+"/second")
	run(t, w1.dispatcher("p1"))
	run(t, w2.dispatcher("p2"))
	for i := range 4 {
		w := w1
		if i%2 == 1 {
			w = w2
		}
		w.lifecycle(t, "team1", "sb"+string(rune('a'+i)))
	}
	gs := rcv.wait(t, 40)
	time.Sleep(200 * time.Millisecond)
	if n := rcv.hits.Load(); n != 40 {
		t.Errorf("%d requests for 20 events to 2 webhooks", n)
	}
	seen := map[string]bool{}
	for _, g := range gs {
		k := g.webhookID + g.id
		if seen[k] {
			t.Errorf("event %s delivered twice to %s", g.id, g.webhookID)
		}
		seen[k] = true
	}
}

// TestSlowTeamHoldsNotEveryWorker: a team whose endpoints all hang takes
// at most MaxTeamWorkers of the workers; another team's webhook is still
// delivered.
func TestSlowTeamHoldsNotEveryWorker(t *testing.T) {
	w := newWorld(t, filepath.Join(t.TempDir(), "warren.db"))
	newTeam(t, w.st, "slow")
	newTeam(t, w.st, "fast")
	release := make(chan struct{})
	hang := newReceiver(t, func(http.ResponseWriter, *http.Request) { <-release })
	t.Cleanup(func() { close(release) })
	fast := newSink(t, func(int) int { return 200 })
	for i := range 3 {
		w.hook(t, "slow", hang.URL+"/"+string(rune('a'+i)))
	}
	w.hook(t, "fast", fast.URL)
	w.lifecycle(t, "slow", "sb-slow")
	d := w.dispatcher("p1")
	d.cfg.MaxWorkers, d.cfg.MaxTeamWorkers = 3, 2
	run(t, d)
	deadline := time.Now().Add(10 * time.Second)
	for hang.hits.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	w.lifecycle(t, "fast", "sb-fast") // after the slow team's workers hang
	fast.wait(t, 5)
	if n := hang.hits.Load(); n != 2 {
		t.Errorf("the slow team's endpoints got %d requests at once, want its bound of 2", n)
	}
}
