package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// fakeNode is a node's sandbox manager over the shared store: creates
// write records placed on it, the other calls record what they were
// asked, and err, when set, is every call's answer.
type fakeNode struct {
	name string
	st   store.Store
	mu   sync.Mutex
	n    int
	err  error
	// gate, if set, holds creates until it is closed, and resumes and
	// forks (counted in held while they wait).
	gate chan struct{}
	held int
	// templates are the templates other than base it has.
	templates map[string]bool
	// asked lists "call team id".
	asked []string
}

func (f *fakeNode) note(call, team, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, call+" "+team+" "+id)
	return f.err
}

func (f *fakeNode) Create(ctx context.Context, req sandbox.CreateRequest) (store.Sandbox, error) {
	f.mu.Lock()
	f.n++
	id := fmt.Sprintf("%s%d", f.name, f.n)
	err, gate := f.err, f.gate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if req.TemplateID != "base" && !f.templates[req.TemplateID] {
		return store.Sandbox{}, fmt.Errorf("%w: %s is not on node %s", sandbox.ErrTemplateNotFound, req.TemplateID, f.name)
	}
	if err != nil {
		return store.Sandbox{}, err
	}
	rec := store.Sandbox{ID: id, TeamID: req.TeamID.String(), TemplateID: req.TemplateID, State: store.StateRunning, Node: f.name,
		StartedAt: time.Now(), EndAt: time.Now().Add(req.Timeout), EnvdAccessToken: "token-" + id, Metadata: req.Metadata}
	return rec, f.st.CreateSandbox(ctx, rec)
}
func (f *fakeNode) Get(ctx context.Context, _ team.ID, id string) (store.Sandbox, error) {
	return f.st.GetSandbox(ctx, id)
}
func (f *fakeNode) List(ctx context.Context, _ team.ID, sf store.SandboxFilter) ([]store.Sandbox, error) {
	return f.st.ListSandboxes(ctx, sf)
}
func (f *fakeNode) Kill(ctx context.Context, tid team.ID, id string) error {
	return f.note("kill", tid.String(), id)
}
func (f *fakeNode) SetTimeout(ctx context.Context, tid team.ID, id string, d time.Duration) error {
	team := tid.String()
	return f.note("timeout", team, id)
}
func (f *fakeNode) Refresh(ctx context.Context, tid team.ID, id string, d time.Duration) error {
	team := tid.String()
	return f.note("refresh", team, id)
}
func (f *fakeNode) Connect(ctx context.Context, tid team.ID, id string, d time.Duration, memory bool) (store.Sandbox, bool, error) {
	team := tid.String()
	if err := f.note("connect", team, id); err != nil {
		return store.Sandbox{}, false, err
	}
	return f.wake(ctx, team, id)
}
func (f *fakeNode) Pause(ctx context.Context, tid team.ID, id string, keep bool) (bool, error) {
	team := tid.String()
	return true, f.note("pause", team, id)
}
func (f *fakeNode) ResumeSandbox(ctx context.Context, tid team.ID, id string, o sandbox.ResumeOptions) (store.Sandbox, error) {
	team := tid.String()
	if err := f.note("resume", team, id); err != nil {
		return store.Sandbox{}, err
	}
	rec, resumed, err := f.wake(ctx, team, id)
	if err == nil && !resumed {
		err = fmt.Errorf("%w: sandbox %s is already running", sandbox.ErrConflict, id)
	}
	return rec, err
}

// Fork makes count running children of a team's sandbox, after the gate.
func (f *fakeNode) Fork(ctx context.Context, tid team.ID, id string, d time.Duration, count int) ([]sandbox.ForkResult, error) {
	team := tid.String()
	if err := f.note("fork", team, id); err != nil {
		return nil, err
	}
	if rec, err := f.st.GetSandbox(ctx, id); err != nil || rec.TeamID != team {
		return nil, fmt.Errorf("%w: %s", sandbox.ErrNotFound, id)
	}
	f.hold()
	out := make([]sandbox.ForkResult, count)
	for i := range out {
		out[i].Sandbox, out[i].Err = f.Create(ctx, sandbox.CreateRequest{TeamID: tid, TemplateID: "base", Timeout: d})
	}
	return out, nil
}

// wake resumes a team's paused sandbox after the gate (resumed), or
// answers a running one as it is.
func (f *fakeNode) wake(ctx context.Context, team, id string) (store.Sandbox, bool, error) {
	rec, err := f.st.GetSandbox(ctx, id)
	if err != nil || rec.TeamID != team {
		return store.Sandbox{}, false, fmt.Errorf("%w: %s", sandbox.ErrNotFound, id)
	}
	if rec.State != store.StatePaused {
		return rec, false, nil
	}
	f.hold()
	rec, err = f.st.UpdateSandbox(ctx, id, func(s *store.Sandbox) error { s.State = store.StateRunning; return nil })
	return rec, true, err
}

// hold waits for the gate, if there is one.
func (f *fakeNode) hold() {
	f.mu.Lock()
	gate := f.gate
	if gate != nil {
		f.held++
	}
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
}
func (f *fakeNode) Metrics(ctx context.Context, tid team.ID, id string, start, end time.Time) ([]sandbox.Metric, error) {
	team := tid.String()
	return []sandbox.Metric{{Time: start, CPUCount: 2, MemUsed: 7}}, f.note("metrics", team, id)
}
func (f *fakeNode) Logs(ctx context.Context, tid team.ID, id string, start time.Time, limit int) ([]sandbox.LogEntry, error) {
	team := tid.String()
	return nil, f.note("logs", team, id)
}
func (f *fakeNode) UpdateNetwork(ctx context.Context, tid team.ID, id string, u sandbox.NetworkUpdate) error {
	team := tid.String()
	return f.note("network", team, id)
}
func (f *fakeNode) NetworkLogs(ctx context.Context, tid team.ID, id string, start time.Time, limit int) ([]egress.Entry, error) {
	team := tid.String()
	return nil, f.note("networklogs", team, id)
}

func (f *fakeNode) set(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

type cluster2 struct {
	st     store.Store
	d      *Dispatcher
	nodes  map[string]*fakeNode
	now    time.Time
	beatAt time.Time
}

// newCluster2 runs two fake nodes behind the real internal handler and
// a Dispatcher that reaches them with the cluster secret.
func newCluster2(t *testing.T) *cluster2 {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, team := range []string{"t1", "t2"} {
		if err := st.CreateTeam(ctx, store.Team{ID: team, Name: team, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	auth, err := cluster.NewAuth([]byte(strings.Repeat("c", 32)))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster2{st: st, nodes: map[string]*fakeNode{}, now: time.Now()}
	c.beatAt = c.now
	for _, name := range []string{"na", "nb"} {
		f := &fakeNode{name: name, st: st}
		traffic := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s %s", name, r.Header.Get("E2b-Sandbox-Id"), r.RemoteAddr)
		})
		platform := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s %s %s", name, r.Method, r.URL.EscapedPath(), r.Host)
		})
		srv := httptest.NewServer(noderpc.Handler(noderpc.Served{Sandboxes: f, Teams: &noderpc.StoreTeams{Store: st}, Traffic: traffic, Platform: platform}, auth.Guard(name)))
		t.Cleanup(srv.Close)
		c.nodes[name] = f
		n := store.Node{Name: name, Address: strings.TrimPrefix(srv.URL, "http://"), Runtime: "runsc", CPUs: 2, MemoryMB: 4096,
			MaxSandboxes: 10, RegisteredAt: c.now, HeartbeatAt: c.now}
		if err := st.RegisterNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	c.d, err = New(Config{Store: st, Transport: noderpc.NewTransport(auth), Now: func() time.Time { return c.now }})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// later moves the clock past the node list's cache.
func (c *cluster2) later(d time.Duration) { c.now = c.now.Add(d) }

func TestDispatcherPlacesAndRoutes(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	d := c.d
	on := map[string]int{}
	var ids []string
	for range 6 {
		rec, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base", Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		on[rec.Node]++
		ids = append(ids, rec.ID)
		// The proxy's way to it, known from the create: the node's name
		// too (its traffic is signed for that node).
		if node, addr, err := d.Locate(ctx, rec.ID); err != nil || node != rec.Node || addr == "" {
			t.Fatalf("locate after create: %q %q %v, want node %s", node, addr, err, rec.Node)
		}
	}
	// No heartbeat since: the creates it has not counted spread them.
	if on["na"] != 3 || on["nb"] != 3 {
		t.Fatalf("placed %v, want 3 on each", on)
	}
	// Two killed on na: the next two creates go there, heartbeat or not.
	var onA []string
	for _, id := range ids {
		if strings.HasPrefix(id, "na") {
			onA = append(onA, id)
		}
	}
	for _, id := range onA[:2] {
		if err := d.Kill(ctx, team.MustParse("t1"), id); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		rec, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"})
		if err != nil || rec.Node != "na" {
			t.Fatalf("a create after two kills on na: %+v %v", rec.Node, err)
		}
	}
	c.nodes["na"].asked = nil

	// Calls go to the sandbox's node, for its team only.
	id := ids[1] // on nb
	home := c.nodes[strings.TrimRight(id, "0123456789")]
	if err := d.Kill(ctx, team.MustParse("t1"), id); err != nil {
		t.Fatal(err)
	}
	if err := d.Kill(ctx, team.MustParse("t2"), id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("another team's kill: %v", err)
	}
	if _, err := d.Get(ctx, team.MustParse("t2"), id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("another team's get: %v", err)
	}
	if got := strings.Join(home.asked, ","); got != "kill t1 "+id {
		t.Fatalf("the node was asked %q", got)
	}
	ms, err := d.Metrics(ctx, team.MustParse("t1"), id, time.UnixMilli(1000), time.UnixMilli(2000))
	if err != nil || len(ms) != 1 || ms[0].MemUsed != 7 || !ms[0].Time.Equal(time.UnixMilli(1000)) {
		t.Fatalf("metrics %+v %v", ms, err)
	}

	// A node's refusal comes back as the manager's error, message and all.
	home.set(fmt.Errorf("%w: sandbox %s is being paused", sandbox.ErrConflict, id))
	if _, err := d.Pause(ctx, team.MustParse("t1"), id, true); !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "is being paused") {
		t.Fatalf("pause: %v", err)
	}
	home.set(&sandbox.ResumeError{ID: id, Step: "restore", Err: errors.New("runsc restore: exit 1")})
	var re *sandbox.ResumeError
	if _, err := d.ResumeSandbox(ctx, team.MustParse("t1"), id, sandbox.ResumeOptions{}); !errors.As(err, &re) || re.Step != "restore" || re.ID != id {
		t.Fatalf("resume: %v", err)
	}
	home.set(errors.New("disk on fire"))
	if err := d.SetTimeout(ctx, team.MustParse("t1"), id, time.Minute); err == nil || !kindless(err) {
		t.Fatalf("an unknown error: %v", err)
	}
	home.set(nil)

	// The proxy's lookups.
	node, addr, err := d.Locate(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	req := mustRequest(t, "http://"+addr+"/files", id)
	req = req.WithContext(cluster.WithTarget(cluster.WithPurpose(ctx, cluster.PurposeTraffic), node))
	res, err := d.cfg.Transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("forwarded traffic: %d", res.StatusCode)
	}
	if _, _, err := d.Locate(ctx, "nosuch"); !errors.Is(err, proxy.ErrNotFound) {
		t.Fatalf("locate unknown: %v", err)
	}
	got, err := d.SignedBy(func(token string) bool { return token == "token-"+ids[3] })
	if err != nil || got != ids[3] {
		t.Fatalf("signed by %q %v", got, err)
	}
	if _, err := d.SignedBy(func(string) bool { return false }); !errors.Is(err, proxy.ErrNotFound) {
		t.Fatalf("signed by nobody: %v", err)
	}
}

func kindless(err error) bool {
	for _, k := range []error{sandbox.ErrNotFound, sandbox.ErrInvalid, sandbox.ErrConflict, sandbox.ErrNoCapacity, sandbox.ErrNodeUnavailable} {
		if errors.Is(err, k) {
			return false
		}
	}
	return true
}

func mustRequest(t *testing.T, url, id string) *http.Request {
	r, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("E2b-Sandbox-Id", id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	return r
}

// Concurrent creates see each other's choices: a burst spreads evenly
// however long the nodes take.
func TestConcurrentCreatesSpread(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	gate := make(chan struct{})
	for _, f := range c.nodes {
		f.gate = gate
	}
	var wg sync.WaitGroup
	nodes := make(chan string, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, err := c.d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"})
			if err != nil {
				t.Error(err)
			}
			nodes <- rec.Node
		}()
	}
	// Every create has chosen (and waits at its node) before any ends.
	for deadline := time.Now().Add(5 * time.Second); ; {
		c.d.mu.Lock()
		n := c.d.inflight["na"] + c.d.inflight["nb"]
		c.d.mu.Unlock()
		if n == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d creates under way", n)
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
	wg.Wait()
	close(nodes)
	on := map[string]int{}
	for n := range nodes {
		on[n]++
	}
	if on["na"] != 4 || on["nb"] != 4 {
		t.Fatalf("a burst of 8 placed %v", on)
	}
}

func TestDispatcherAroundFullLostAndCordonedNodes(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	d := c.d
	// A full node's refusal sends the create to the other.
	c.nodes["na"].set(fmt.Errorf("%w: node na is full", sandbox.ErrNoCapacity))
	for range 3 {
		rec, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"})
		if err != nil || rec.Node != "nb" {
			t.Fatalf("create with na full: %+v %v", rec, err)
		}
	}
	c.nodes["nb"].set(fmt.Errorf("%w: node nb is full", sandbox.ErrNoCapacity))
	_, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"})
	if !errors.Is(err, sandbox.ErrNoCapacity) || !strings.Contains(err.Error(), "na: ") || !strings.Contains(err.Error(), "nb: ") {
		t.Fatalf("a full cluster: %v", err)
	}
	if errors.Is(err, sandbox.ErrDiskFull) {
		t.Errorf("a cluster without CPU or memory reads as a full disk: %v", err)
	}
	// Every node below its disk reserve: the cluster's answer is a full
	// disk (507), as one node's is.
	diskFull := func(n string) error {
		return fmt.Errorf("%w: %w: node %s has 10 MB free", sandbox.ErrNoCapacity, sandbox.ErrDiskFull, n)
	}
	c.nodes["na"].set(diskFull("na"))
	if _, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"}); !errors.Is(err, sandbox.ErrNoCapacity) || errors.Is(err, sandbox.ErrDiskFull) {
		t.Errorf("one disk full, one node without memory: %v", err)
	}
	c.nodes["nb"].set(diskFull("nb"))
	if _, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"}); !errors.Is(err, sandbox.ErrDiskFull) || !errors.Is(err, sandbox.ErrNoCapacity) {
		t.Errorf("every node's disk full: %v", err)
	}
	c.nodes["na"].set(nil)
	c.nodes["nb"].set(nil)

	recs, err := d.List(ctx, team.MustParse("t1"), store.SandboxFilter{})
	if err != nil || len(recs) != 3 {
		t.Fatalf("list: %d %v", len(recs), err)
	}
	// nb goes quiet: past the lost timeout its sandboxes are gone, and
	// creates go to na.
	if _, err := c.st.HeartbeatNode(ctx, "na", c.now.Add(cluster.DefaultLostAfter), store.NodeUsage{}); err != nil {
		t.Fatal(err)
	}
	c.later(cluster.DefaultLostAfter + time.Second)
	if _, err := d.Get(ctx, team.MustParse("t1"), recs[0].ID); !errors.Is(err, sandbox.ErrNotFound) || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("get on a lost node: %v", err)
	}
	if err := d.Kill(ctx, team.MustParse("t1"), recs[0].ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("kill on a lost node: %v", err)
	}
	if _, _, err := d.Locate(ctx, recs[0].ID); !errors.Is(err, proxy.ErrNotFound) {
		t.Fatalf("locate on a lost node: %v", err)
	}
	if recs, _ := d.List(ctx, team.MustParse("t1"), store.SandboxFilter{}); len(recs) != 0 {
		t.Fatalf("list shows %d sandboxes of a lost node", len(recs))
	}
	rec, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"})
	if err != nil || rec.Node != "na" {
		t.Fatalf("create with nb lost: %+v %v", rec, err)
	}
	// Cordoned, na takes nothing either: no node is ready.
	if err := c.st.SetNodeState(ctx, "na", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	c.later(time.Second)
	if _, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"}); !errors.Is(err, sandbox.ErrNoCapacity) {
		t.Fatalf("create with no node ready: %v", err)
	}
}

func TestDispatcherNeedsTheClusterSecret(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	wrong, _ := cluster.NewAuth([]byte(strings.Repeat("w", 32)))
	d, err := New(Config{Store: c.st, Transport: noderpc.NewTransport(wrong), Now: func() time.Time { return c.now }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"})
	if !errors.Is(err, sandbox.ErrNoCapacity) || !strings.Contains(err.Error(), "unavailable") {
		t.Fatalf("create with the wrong secret: %v", err)
	}
	for name, f := range c.nodes {
		if f.n != 0 {
			t.Errorf("node %s made %d sandboxes for a request without the secret", name, f.n)
		}
	}
}

// Templates live on their home node: their routes go there, their
// sandboxes are placed there first, and a node without the template
// passes the create on.
func TestTemplatesGoHome(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	d := c.d
	home, ok := d.home(ctx, "tpl1")
	if !ok {
		t.Fatal("no home")
	}
	other := "na"
	if home.Name == "na" {
		other = "nb"
	}
	for range 3 {
		if h, _ := d.home(ctx, "tpl1"); h.Name != home.Name {
			t.Fatalf("home moved: %s, %s", h.Name, home.Name)
		}
	}
	homes := map[string]int{}
	for i := range 40 {
		h, _ := d.home(ctx, fmt.Sprintf("t%d", i))
		homes[h.Name]++
	}
	if homes["na"] < 5 || homes["nb"] < 5 {
		t.Errorf("40 templates' homes: %v", homes)
	}

	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "api "+r.URL.Path) })
	srv := httptest.NewServer(d.Platform(api))
	defer srv.Close()
	get := func(method, path string) string {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	// An escaped '/' in a ref reaches the node escaped.
	if got := get("GET", "/templates/team%2Fname:v1"); !strings.Contains(got, "GET /templates/team%2Fname:v1 ") {
		t.Errorf("an escaped ref: %q", got)
	}
	for _, path := range []string{"/templates/tpl1", "/v2/templates/tpl1/builds/b1", "/templates/tpl1/files/abc", "/upload/templates/tpl1/files/abc", "/templates/tpl1/builds/b1/status"} {
		if got, want := get("POST", path), home.Name+" POST "+path+" "+host; got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
	if got := get("GET", "/v2/sandboxes"); got != "api /v2/sandboxes" {
		t.Errorf("a sandbox route: %q", got)
	}
	// A snapshot goes to its sandbox's node.
	c.nodes["na"].templates = map[string]bool{}
	c.nodes["nb"].templates = map[string]bool{}
	rec, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if got := get("POST", "/sandboxes/"+rec.ID+"/snapshots"); !strings.HasPrefix(got, rec.Node+" POST /sandboxes/") {
		t.Errorf("a snapshot went %q, its sandbox is on %s", got, rec.Node)
	}

	// The template only on the other node: its create ends there.
	c.nodes[other].templates["tpl1"] = true
	rec, err = d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "tpl1"})
	if err != nil || rec.Node != other {
		t.Fatalf("create of a template on %s only: %+v %v", other, rec.Node, err)
	}
	// Built on a node (its build's record says which): there first,
	// whatever the load, by ID or by name.
	builder := other
	if err := c.st.CreateTemplate(ctx, store.Template{ID: "tpl2", TeamID: "t1", Names: []string{"two"}, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := c.st.CreateBuild(ctx, store.Build{ID: "b2", TemplateID: "tpl2", Status: store.BuildReady, Node: builder, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	c.nodes["na"].templates["tpl2"], c.nodes["nb"].templates["tpl2"] = true, true
	c.nodes["na"].templates["two"], c.nodes["nb"].templates["two"] = true, true
	for _, ref := range []string{"tpl2", "two", "tpl2", "two"} {
		if rec, err := c.d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: ref}); err != nil || rec.Node != builder {
			t.Fatalf("create of %s (built on %s): %+v %v", ref, builder, rec.Node, err)
		}
	}
	// Nowhere: the node's 404, not a 503.
	if _, err := d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "nosuch"}); !errors.Is(err, sandbox.ErrTemplateNotFound) {
		t.Fatalf("create of a template no node has: %v", err)
	}
}

// A node that holds a warm sandbox of the template comes first, home or
// not; among the others, the order stands.
func TestWarmNodesFirst(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	home, _ := c.d.home(ctx, "tpl3")
	other := map[string]string{"na": "nb", "nb": "na"}[home.Name]
	for _, f := range c.nodes {
		f.templates = map[string]bool{"tpl3": true}
	}
	if _, err := c.st.HeartbeatNode(ctx, other, c.now, store.NodeUsage{Warm: map[string]int{"base": 2, "tpl3": 1}}); err != nil {
		t.Fatal(err)
	}
	c.later(time.Second)
	rec, err := c.d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "tpl3"})
	if err != nil || rec.Node != other {
		t.Fatalf("create of tpl3, warm on %s, home %s: %+v %v", other, home.Name, rec.Node, err)
	}
	// Its one warm sandbox is taken: the next goes by load, to the other.
	if rec, err := c.d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "tpl3"}); err != nil || rec.Node != home.Name {
		t.Fatalf("the second create of tpl3: %+v %v", rec.Node, err)
	}
	w := func(t map[string]int) store.NodeUsage { return store.NodeUsage{Warm: t} }
	ns := []store.Node{{Name: "a"}, {Name: "b", NodeUsage: w(map[string]int{"x": 1})}, {Name: "c"}, {Name: "d", NodeUsage: w(map[string]int{"x": 3, "y": 1})}}
	order := func(pending map[string]int) string {
		var got []string
		for _, n := range warmFirst(ns, "x", func(n store.Node) int { return pending[n.Name] }) {
			got = append(got, n.Name)
		}
		return strings.Join(got, " ")
	}
	if got := order(nil); got != "b d a c" {
		t.Errorf("warmFirst: %v", got)
	}
	if got := order(map[string]int{"b": 1, "d": 2}); got != "d a b c" {
		t.Errorf("warmFirst with creates sent: %v", got)
	}
}

// A sandbox killed on a node since its heartbeat lowers the node's load,
// but leaves no warm sandbox there: a template's create still goes home.
// (It went to the other node when a kill there made its count of sent
// creates negative, which read as "more warm sandboxes than claims".)
func TestAKillMakesNoWarmSandbox(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	builder := "na"
	if err := c.st.CreateTemplate(ctx, store.Template{ID: "tpl4", TeamID: "t1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := c.st.CreateBuild(ctx, store.Build{ID: "b4", TemplateID: "tpl4", Status: store.BuildReady, Node: builder, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, f := range c.nodes {
		f.templates = map[string]bool{"tpl4": true}
	}
	// A sandbox on the other node, placed and heartbeaten before; then
	// killed through this api.
	rec := store.Sandbox{ID: "old", TeamID: "t1", TemplateID: "base", State: store.StateRunning, Node: "nb", StartedAt: c.now, EndAt: c.now.Add(time.Hour)}
	if err := c.st.CreateSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := c.st.HeartbeatNode(ctx, "nb", c.now, store.NodeUsage{Sandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	c.later(time.Second)
	if err := c.d.Kill(ctx, team.MustParse("t1"), "old"); err != nil {
		t.Fatal(err)
	}
	c.later(time.Second)
	for range 2 {
		if rec, err := c.d.Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "tpl4"}); err != nil || rec.Node != builder {
			t.Fatalf("create of tpl4 (built on %s, nothing warm) after a kill on nb: %+v %v", builder, rec.Node, err)
		}
	}
}

func TestTemplateKey(t *testing.T) {
	for path, want := range map[string][3]string{
		"/templates":                     {"", "", "y"},
		"/templates/abc":                 {"abc", "", "y"},
		"/templates/abc/builds/b/status": {"abc", "", "y"},
		"/templates/tags":                {"", "", "y"},
		"/templates/aliases/x":           {"", "", "y"},
		"/v3/templates":                  {"", "", "y"},
		"/v2/templates/abc/builds/b":     {"abc", "", "y"},
		"/upload/templates/abc/files/h":  {"abc", "", "y"},
		"/snapshots":                     {"", "", "y"},
		"/sandboxes/sbx1/snapshots":      {"", "sbx1", "y"},
		"/sandboxes/sbx1":                {"", "", ""},
		"/v2/sandboxes":                  {"", "", ""},
		"/volumes":                       {"", "", ""},
		"/health":                        {"", "", ""},
		"/dashboard-api/templates":       {"", "", "y"},
		"/dashboard-api/builds/b":        {"", "", "y"},
		"/dashboard-apix/templates":      {"", "", ""},
	} {
		key, sbx, ok := templateKey(path)
		if key != want[0] || sbx != want[1] || ok != (want[2] == "y") {
			t.Errorf("%s: %q %q %v, want %v", path, key, sbx, ok, want)
		}
	}
}

func TestOrder(t *testing.T) {
	now := time.Now()
	n := func(name string, state store.NodeState, held, maxSb, usedMB int, beat time.Time) store.Node {
		return store.Node{Name: name, Address: name + ":1", State: state, MaxSandboxes: maxSb, MemoryMB: 8192, HeartbeatAt: beat,
			NodeUsage: store.NodeUsage{Sandboxes: held, UsedMemoryMB: usedMB}}
	}
	nodes := []store.Node{
		n("busy", store.NodeReady, 8, 10, 4096, now),
		n("idle", store.NodeReady, 1, 10, 512, now),
		n("full", store.NodeReady, 10, 10, 8000, now),
		n("cordoned", store.NodeCordoned, 0, 10, 0, now),
		n("draining", store.NodeDraining, 0, 10, 0, now),
		n("lost", store.NodeReady, 0, 10, 0, now.Add(-time.Minute)),
		n("twin", store.NodeReady, 1, 10, 256, now),
		{Name: "noaddr", State: store.NodeReady, MaxSandboxes: 10, MemoryMB: 8192, HeartbeatAt: now},
	}
	names := func(pending map[string]int) string {
		var s []string
		for _, n := range order(nodes, now, 10*time.Second, func(n store.Node) int { return pending[n.Name] }) {
			s = append(s, n.Name)
		}
		return strings.Join(s, " ")
	}
	if got := names(nil); got != "twin idle busy" {
		t.Errorf("order %q", got)
	}
	// Sandboxes placed since the heartbeat count.
	if got := names(map[string]int{"twin": 1, "idle": 0}); got != "idle twin busy" {
		t.Errorf("order with pending %q", got)
	}
	if got := names(map[string]int{"busy": 2}); got != "twin idle" {
		t.Errorf("a node full with its pending creates: %q", got)
	}
}

// Two api replicas, each with several creates of one team under way at
// once, never let the team past --max-sandboxes-per-team: the check and
// the reservation are one step in the store.
func TestTeamLimitHoldsAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	gate := make(chan struct{})
	for _, f := range c.nodes {
		f.gate = gate
	}
	const limit, creates = 2, 8
	cfg := c.d.cfg
	cfg.MaxPerTeam = limit
	var replicas []*Dispatcher
	for range 2 {
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, d)
	}
	inflight := func() int {
		n := 0
		for _, d := range replicas {
			d.mu.Lock()
			n += d.inflight["na"] + d.inflight["nb"]
			d.mu.Unlock()
		}
		return n
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var made []string
	refused := 0
	for i := range creates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, err := replicas[i%2].Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made = append(made, rec.ID)
			case errors.Is(err, sandbox.ErrTeamLimit):
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	// Every create has either been refused or waits at its node.
	for deadline := time.Now().Add(5 * time.Second); ; {
		mu.Lock()
		n := refused
		mu.Unlock()
		if n+inflight() == creates {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d refused, %d under way", n, inflight())
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
	wg.Wait()
	if len(made) != limit || refused != creates-limit {
		t.Fatalf("%d creates at once with a limit of %d: %d made (%v), %d refused", creates, limit, len(made), made, refused)
	}
	// Once they run, they count as sandboxes: still no room.
	if _, err := replicas[0].Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"}); !errors.Is(err, sandbox.ErrTeamLimit) {
		t.Errorf("a create at the limit: %v", err)
	}
	// Another team has its own.
	if _, err := replicas[1].Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t2"), TemplateID: "base"}); err != nil {
		t.Errorf("another team: %v", err)
	}
	// A failed create gives its place back.
	if _, err := c.st.UpdateSandbox(ctx, made[0], func(s *store.Sandbox) error { s.State = store.StateKilled; return nil }); err != nil {
		t.Fatal(err)
	}
	c.nodes["na"].set(errors.New("boom"))
	c.nodes["nb"].set(errors.New("boom"))
	if _, err := replicas[0].Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"}); err == nil || errors.Is(err, sandbox.ErrTeamLimit) {
		t.Errorf("a create on failing nodes: %v", err)
	}
	c.nodes["na"].set(nil)
	c.nodes["nb"].set(nil)
	if _, err := replicas[1].Create(ctx, sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base"}); err != nil {
		t.Errorf("a create after one was killed and one failed: %v", err)
	}
}

// A node that does not answer holds a create only PlacementTimeout: the
// create fails as a timeout (the API's 504 sandbox_placement_timeout),
// not as a node that was unavailable, and no other node is tried with
// the time that is left.
func TestPlacementTimeout(t *testing.T) {
	c := newCluster2(t)
	c.d.cfg.PlacementTimeout = 300 * time.Millisecond
	gate := make(chan struct{})
	for _, f := range c.nodes {
		f.mu.Lock()
		f.gate = gate
		f.mu.Unlock()
	}
	start := time.Now()
	_, err := c.d.Create(context.Background(), sandbox.CreateRequest{TeamID: team.MustParse("t1"), TemplateID: "base", Timeout: time.Minute})
	took := time.Since(start)
	close(gate)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sandbox.ErrNoCapacity) || errors.Is(err, sandbox.ErrNodeUnavailable) {
		t.Fatalf("a hung node: %v", err)
	}
	if took > 5*time.Second {
		t.Errorf("the create was held %s", took)
	}
	asked := 0
	for _, f := range c.nodes {
		f.mu.Lock()
		asked += f.n
		f.mu.Unlock()
	}
	if asked != 1 {
		t.Errorf("%d nodes were asked, want 1", asked)
	}
}
