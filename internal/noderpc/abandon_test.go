package noderpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	nodev1 "github.com/warren-sandbox/warren/proto/node/v1"
)

// slowCreator is a node's sandbox manager whose creates take until
// release is closed, whatever their context (past the point where a
// create can be called back), and which keeps what they made until it
// is killed.
type slowCreator struct {
	Sandboxes             // the rest is never called
	started   chan string // a create began
	ended     chan string // a create returned
	release   chan struct{}
	err       error

	mu    sync.Mutex
	n     int
	alive map[string]bool
	kills int
}

func newSlowCreator() *slowCreator {
	return &slowCreator{started: make(chan string, 16), ended: make(chan string, 16), release: make(chan struct{}), alive: map[string]bool{}}
}

func (f *slowCreator) Create(ctx context.Context, req sandbox.CreateRequest) (store.Sandbox, error) {
	f.mu.Lock()
	f.n++
	id := fmt.Sprint("sbx", f.n)
	f.mu.Unlock()
	f.started <- id
	defer func() { f.ended <- id }()
	<-f.release
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return store.Sandbox{}, f.err
	}
	f.alive[id] = true
	return store.Sandbox{ID: id, TeamID: req.TeamID.String(), State: store.StateRunning}, nil
}

func (f *slowCreator) Kill(ctx context.Context, _ team.ID, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.alive[id] {
		return fmt.Errorf("%w: %s", sandbox.ErrNotFound, id)
	}
	delete(f.alive, id)
	f.kills++
	return nil
}

// running lists the sandboxes it keeps.
func (f *slowCreator) running() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.alive {
		ids = append(ids, id)
	}
	return ids
}

// untilNone waits until f keeps no sandbox.
func (f *slowCreator) untilNone(t *testing.T, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(f.running()) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the node keeps %v, which nobody will ever see", what, f.running())
		}
	}
}

// tripper is a RoundTripper as a function.
type tripper func(*http.Request) (*http.Response, error)

func (f tripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// abandonNode serves f as a node's internal address; its client's calls
// go through wrap, if set, and the AbandonCreate calls are counted.
func abandonNode(t *testing.T, f *slowCreator, wrap func(http.RoundTripper) http.RoundTripper) (*Client, *int) {
	t.Helper()
	auth, err := cluster.NewAuth([]byte(strings.Repeat("a", 32)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(Served{Sandboxes: f, Teams: fakeTeams{"t1": true}, Traffic: http.NotFoundHandler()}, auth.Guard("n1")))
	t.Cleanup(srv.Close)
	var mu sync.Mutex
	abandons := new(int)
	var rt http.RoundTripper = NewTransport(auth)
	if wrap != nil {
		rt = wrap(rt)
	}
	counted := rt
	rt = tripper(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/AbandonCreate") {
			mu.Lock()
			*abandons++
			mu.Unlock()
		}
		return counted.RoundTrip(r)
	})
	return NewClient("n1", strings.TrimPrefix(srv.URL, "http://"), rt), abandons
}

// The api's context ends while the node creates: the node ends with no
// sandbox for that create.
func TestCreateCancelledMidwayLeavesNoSandbox(t *testing.T) {
	f := newSlowCreator()
	c, _ := abandonNode(t, f, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base", Timeout: time.Minute})
		done <- err
	}()
	<-f.started
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a create whose context ended answered a sandbox")
	}
	close(f.release) // the node's create ends after the api gave up
	<-f.ended
	f.untilNone(t, "a create cancelled midway")
}

// The node answered, but the answer never reached the api (the
// connection broke): the api abandons the create and the node kills what
// it made.
func TestCreateWhoseAnswerIsLostLeavesNoSandbox(t *testing.T) {
	f := newSlowCreator()
	close(f.release)
	c, abandons := abandonNode(t, f, func(rt http.RoundTripper) http.RoundTripper {
		return tripper(func(r *http.Request) (*http.Response, error) {
			res, err := rt.RoundTrip(r)
			if err != nil || !strings.HasSuffix(r.URL.Path, "/CreateSandbox") {
				return res, err
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			return nil, errors.New("read: connection reset by peer")
		})
	})
	_, err := c.Create(context.Background(), sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base", Timeout: time.Minute})
	if !errors.Is(err, sandbox.ErrNodeUnavailable) {
		t.Fatalf("a create whose answer was lost: %v", err)
	}
	if *abandons != 1 {
		t.Errorf("%d AbandonCreate calls, want 1", *abandons)
	}
	f.untilNone(t, "a create whose answer was lost")
}

// A node's own refusal made nothing: nothing to abandon; a created
// sandbox the api took is kept.
func TestAnsweredCreatesAreNotAbandoned(t *testing.T) {
	f := newSlowCreator()
	close(f.release)
	c, abandons := abandonNode(t, f, nil)
	rec, err := c.Create(context.Background(), sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	<-f.started
	f.mu.Lock()
	f.err = fmt.Errorf("%w: full", sandbox.ErrNoCapacity)
	f.mu.Unlock()
	if _, err := c.Create(context.Background(), sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"}); !errors.Is(err, sandbox.ErrNoCapacity) {
		t.Fatalf("a refused create: %v", err)
	}
	<-f.started
	f.mu.Lock()
	kills := f.kills
	f.mu.Unlock()
	if *abandons != 0 || kills != 0 || len(f.running()) != 1 || f.running()[0] != rec.ID {
		t.Errorf("%d abandons, %d kills, running %v, want none, none and %s", *abandons, kills, f.running(), rec.ID)
	}
}

// An AbandonCreate that overtakes its create (the create still in
// flight to the node) has it refused when it comes; another team's
// request of the same ID is its own.
func TestAbandonBeforeTheCreateArrives(t *testing.T) {
	f := newSlowCreator()
	close(f.release)
	s := newService(f)
	ctx := context.Background()
	if _, err := s.AbandonCreate(ctx, connect.NewRequest(&nodev1.AbandonCreateRequest{TeamId: "t1", RequestId: "r1"})); err != nil {
		t.Fatal(err)
	}
	if _, err := s.create(ctx, "r1", sandbox.CreateRequest{TeamID: team.MustParse("t1")}); err == nil || !strings.Contains(err.Error(), "abandoned") {
		t.Fatalf("a create abandoned before it came: %v", err)
	}
	if len(f.running()) != 0 {
		t.Fatalf("made %v", f.running())
	}
	if _, err := s.create(ctx, "r1", sandbox.CreateRequest{TeamID: team.MustParse("t2")}); err != nil {
		t.Fatalf("another team's create of the same request ID: %v", err)
	}
	// A request ID is used once; an empty team or ID abandons nothing.
	if _, err := s.create(ctx, "r1", sandbox.CreateRequest{TeamID: team.MustParse("t2")}); !errors.Is(fromConnect("n", err), sandbox.ErrInvalid) {
		t.Errorf("a request ID used twice: %v", err)
	}
	for _, r := range []*nodev1.AbandonCreateRequest{{TeamId: "", RequestId: "r1"}, {TeamId: "t2", RequestId: ""}, {TeamId: "t2", RequestId: "r/1"}} {
		if _, err := s.AbandonCreate(ctx, connect.NewRequest(r)); !errors.Is(fromConnect("n", err), sandbox.ErrInvalid) {
			t.Errorf("abandon %+v: %v", r, err)
		}
	}
	if len(f.running()) != 1 {
		t.Errorf("running %v, want t2's one", f.running())
	}
}

func TestCreateLogIsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newCreateLog()
	l.max, l.ttl, l.now = 3, time.Minute, func() time.Time { return now }
	for _, r := range []string{"a", "b", "c"} {
		if err := l.begin("t", r); err != nil {
			t.Fatal(err)
		}
	}
	// Full of creates under way: none is forgotten, a fourth is refused.
	if err := l.begin("t", "d"); !errors.Is(err, sandbox.ErrNoCapacity) {
		t.Fatalf("a fourth create in a full log: %v", err)
	}
	if l.abandon("t", "x") != "" || len(l.entries) != 3 {
		t.Fatalf("an abandon in a log full of creates under way took a place: %d entries", len(l.entries))
	}
	l.end("t", "a", "sbx-a")
	now = now.Add(time.Second)
	l.end("t", "b", "sbx-b")
	// The oldest ended is forgotten for a new one; one under way is not.
	if err := l.begin("t", "d"); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.entries[createKey{"t", "a"}]; ok {
		t.Error("the oldest ended create was kept")
	}
	if got := l.abandon("t", "b"); got != "sbx-b" {
		t.Errorf("abandoning a remembered create: %q", got)
	}
	// Past the TTL, what ended is forgotten at the next insertion.
	now = now.Add(2 * time.Minute)
	l.end("t", "c", "")
	l.max = 100
	if err := l.begin("t", "e"); err != nil {
		t.Fatal(err)
	}
	if len(l.entries) != 3 { // c (ended just now), d (under way), e
		t.Errorf("entries after the TTL: %v", l.entries)
	}
	if !validRequestID(newRequestID()) || validRequestID(strings.Repeat("a", 65)) || validRequestID("a b") {
		t.Error("request ID validation")
	}
}

// An abandon while the create is under way leaves the kill to the
// create's end; the sandbox is killed once.
func TestAbandonWhileCreating(t *testing.T) {
	l := newCreateLog()
	if err := l.begin("t", "r"); err != nil {
		t.Fatal(err)
	}
	if got := l.abandon("t", "r"); got != "" {
		t.Fatalf("abandoning a create under way: %q to kill now", got)
	}
	if !l.end("t", "r", "sbx1") {
		t.Fatal("a create abandoned meanwhile ended without its sandbox to kill")
	}
	if got := l.abandon("t", "r"); got != "" {
		t.Errorf("abandoning it again: %q to kill", got)
	}
	// Abandoned in another team's name: not this create.
	if err := l.begin("t", "r2"); err != nil {
		t.Fatal(err)
	}
	l.abandon("u", "r2")
	if l.end("t", "r2", "sbx2") || l.abandon("t", "r2") != "sbx2" {
		t.Error("another team's abandon reached the create")
	}
}
