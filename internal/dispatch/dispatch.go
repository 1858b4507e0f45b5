// Package dispatch is the sandbox service of an api process (`warren
// serve --role api`): it places each create on a node (placement.go),
// sends every other call about a sandbox to the node that runs it
// (internal/noderpc), answers reads from the shared store, and tells the
// proxy which node a sandbox's traffic goes to.
//
// A sandbox lives on one node: its processes, memory and checkpoint are
// that node's. When the node is lost (no heartbeat for LostAfter), its
// sandboxes are gone to the API (404, not a hang) until the node comes
// back and adopts them again; a paused sandbox's checkpoint stays on its
// node's data dir, so it resumes there only, unless it is in the nodes'
// blob store (resume.go).
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/template"
)

// Config wires a Dispatcher.
type Config struct {
	Store store.Store
	// Transport reaches the nodes, authenticated (noderpc.NewTransport).
	Transport http.RoundTripper
	// LostAfter is how old a node's heartbeat may be before it is lost;
	// default cluster.DefaultLostAfter.
	LostAfter time.Duration
	// MaxPerTeam bounds a team's running sandboxes across the cluster
	// (0: no bound here; each node applies its own too).
	MaxPerTeam int
	// PlacementTimeout bounds a create's placement, every node it tries
	// included: past it the create fails with context.DeadlineExceeded
	// (the API's 504 sandbox_placement_timeout), and what a node may
	// still make is abandoned. 0: no bound.
	PlacementTimeout time.Duration
	Logger           *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Dispatcher implements the API's sandbox service over the cluster's
// nodes.
type Dispatcher struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	clients map[string]*noderpc.Client // by name and address
	nodes   []store.Node
	nodesAt time.Time
	// placed is when creates went to each node, and freed when this api
	// killed or paused one there: those after the node's last heartbeat
	// are not in its figures yet (placement.go).
	placed, freed map[string][]time.Time
	// inflight is the creates under way on each node.
	inflight map[string]int
	routes   map[string]route
	// signed holds the routable sandboxes' envd tokens (signed.go).
	signed signedIndex
}

// route is a sandbox's node, as the proxy last looked it up.
type route struct {
	node, addr string
	at         time.Time
}

// nodesTTL and routeTTL are how long the node list and a sandbox's route
// are reused: a lost node or a killed sandbox is noticed within them.
const (
	nodesTTL = 500 * time.Millisecond
	routeTTL = time.Second
)

// New returns a Dispatcher.
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Store == nil || cfg.Transport == nil {
		return nil, errors.New("dispatch: Store and Transport are required")
	}
	if cfg.LostAfter <= 0 {
		cfg.LostAfter = cluster.DefaultLostAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Dispatcher{cfg: cfg, log: cfg.Logger, clients: map[string]*noderpc.Client{},
		placed: map[string][]time.Time{}, freed: map[string][]time.Time{}, inflight: map[string]int{}, routes: map[string]route{}}, nil
}

// nodeList is the cluster's nodes, read at most every nodesTTL.
func (d *Dispatcher) nodeList(ctx context.Context) ([]store.Node, error) {
	d.mu.Lock()
	if d.nodes != nil && d.cfg.Now().Sub(d.nodesAt) < nodesTTL {
		ns := d.nodes
		d.mu.Unlock()
		return ns, nil
	}
	d.mu.Unlock()
	ns, err := d.cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.nodes, d.nodesAt = ns, d.cfg.Now()
	d.mu.Unlock()
	return ns, nil
}

// liveNode is node name's record, if it is heard from and has an
// address; else ErrNotFound for the sandbox id on it.
func (d *Dispatcher) liveNode(ctx context.Context, name, id string) (store.Node, error) {
	ns, err := d.nodeList(ctx)
	if err != nil {
		return store.Node{}, err
	}
	for _, n := range ns {
		if n.Name != name {
			continue
		}
		if n.Lost(d.cfg.Now(), d.cfg.LostAfter) {
			return store.Node{}, fmt.Errorf("%w: %s (its node %s is lost: no heartbeat since %s)", sandbox.ErrNotFound, id, name, n.HeartbeatAt.UTC().Format(time.RFC3339))
		}
		if n.Address == "" {
			return store.Node{}, fmt.Errorf("%w: %s (its node %s has no internal address: a --role all server's sandboxes are its own)", sandbox.ErrNotFound, id, name)
		}
		return n, nil
	}
	return store.Node{}, fmt.Errorf("%w: %s (its node %s is not registered)", sandbox.ErrNotFound, id, name)
}

// client is the RPC client of node n.
func (d *Dispatcher) client(n store.Node) *noderpc.Client {
	key := n.Name + "@" + n.Address
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.clients[key]
	if c == nil {
		c = noderpc.NewClient(n.Name, n.Address, d.cfg.Transport)
		d.clients[key] = c
	}
	return c
}

func visible(s store.SandboxState) bool {
	return s == store.StateRunning || s == store.StatePaused
}

// Get returns a team's sandbox: running or paused, on a node that is not
// lost.
func (d *Dispatcher) Get(ctx context.Context, teamID team.ID, id string) (store.Sandbox, error) {
	rec, _, err := d.find(ctx, teamID, id)
	if err != nil {
		// Paused in the blob store, it outlives its node.
		if rec, _, merr := d.movable(ctx, teamID, id, err); merr == nil {
			return rec, nil
		}
	}
	return rec, err
}

// find is a team's visible sandbox and its node, which is not lost.
func (d *Dispatcher) find(ctx context.Context, teamID team.ID, id string) (store.Sandbox, store.Node, error) {
	rec, err := d.cfg.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (!teamID.Owns(rec.TeamID) || !visible(rec.State))) {
		return store.Sandbox{}, store.Node{}, fmt.Errorf("%w: %s", sandbox.ErrNotFound, id)
	}
	if err != nil {
		return store.Sandbox{}, store.Node{}, err
	}
	n, err := d.liveNode(ctx, rec.Node, id)
	if err != nil {
		return store.Sandbox{}, store.Node{}, err
	}
	return rec, n, nil
}

// List returns a team's sandboxes matching f, but those on lost nodes
// (a paused one kept in the blob store stays: it resumes on any node).
// They are left out by the store's query, not after it, so that a page
// holds f.Limit sandboxes when there are that many: a page cut short by
// a lost node's sandboxes read as the last one, and ended the listing.
func (d *Dispatcher) List(ctx context.Context, teamID team.ID, f store.SandboxFilter) ([]store.Sandbox, error) {
	if teamID.IsZero() {
		return nil, nil
	}
	f.Teams = teamID.Scope()
	if len(f.States) == 0 {
		f.States = []store.SandboxState{store.StateRunning, store.StatePaused}
	}
	live, err := d.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	f.OnNodes, f.OrInBlobStore = live, true
	return d.cfg.Store.ListSandboxes(ctx, f)
}

// liveNodes names the nodes whose sandboxes are reachable: heard from
// within LostAfter, with an address (liveNode); never nil.
func (d *Dispatcher) liveNodes(ctx context.Context) ([]string, error) {
	ns, err := d.nodeList(ctx)
	if err != nil {
		return nil, err
	}
	live := []string{}
	for _, n := range ns {
		if _, err := d.liveNode(ctx, n.Name, ""); err == nil {
			live = append(live, n.Name)
		}
	}
	return live, nil
}

// CountSandboxes is how many of a team's sandboxes List would return for f (its
// Limit and After aside): counted by node in the store, those on lost
// nodes left out.
func (d *Dispatcher) CountSandboxes(ctx context.Context, teamID team.ID, f store.SandboxFilter) (int, error) {
	if teamID.IsZero() {
		return 0, nil
	}
	f.Teams = teamID.Scope()
	if len(f.States) == 0 {
		f.States = []store.SandboxState{store.StateRunning, store.StatePaused}
	}
	live, err := d.liveNodes(ctx)
	if err != nil {
		return 0, err
	}
	f.OnNodes, f.OrInBlobStore = live, true
	byNode, err := d.cfg.Store.CountSandboxes(ctx, f)
	total := 0
	for _, n := range byNode {
		total += n
	}
	return total, err
}

// on finds a team's sandbox and the client of its node.
func (d *Dispatcher) on(ctx context.Context, teamID team.ID, id string) (*noderpc.Client, error) {
	c, _, err := d.onNode(ctx, teamID, id)
	return c, err
}

// onNode is on, with the node's name.
func (d *Dispatcher) onNode(ctx context.Context, teamID team.ID, id string) (*noderpc.Client, string, error) {
	_, n, err := d.find(ctx, teamID, id)
	if err != nil {
		return nil, "", err
	}
	return d.client(n), n.Name, nil
}

// Create places a sandbox on the best node that takes it.
func (d *Dispatcher) Create(ctx context.Context, req sandbox.CreateRequest) (store.Sandbox, error) {
	if d.cfg.PlacementTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.cfg.PlacementTimeout)
		defer cancel()
	}
	release, err := d.admit(ctx, req.TeamID)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	ns, err := d.nodeList(ctx)
	if err != nil {
		return store.Sandbox{}, err
	}
	// Locality: a built template's image is on the node that built it
	// (the others pull it first); base is on every node.
	builtOn := ""
	if req.TemplateID != baseimage.TemplateID {
		if bd, err := template.BuildOf(ctx, d.cfg.Store, req.TeamID.String(), req.TemplateID); err == nil {
			builtOn = bd.Node
		}
	}
	// The first choice is reserved in the same critical section as the
	// order is made, so that concurrent creates see each other.
	d.mu.Lock()
	cands := order(ns, d.cfg.Now(), d.cfg.LostAfter, d.pendingLocked)
	if builtOn != "" {
		cands = homeFirst(cands, builtOn)
	}
	if req.TemplateID != baseimage.TemplateID {
		// A warm sandbox of it waits there: before any node that would
		// boot one (each group in its order). Not for base, whose pools
		// every node keeps: there the load decides, or a node whose pool
		// refills steadily would take every create.
		cands = warmFirst(cands, req.TemplateID, d.sentLocked)
	}
	if len(cands) > 0 {
		d.inflight[cands[0].Name]++
	}
	d.mu.Unlock()
	if d.log.Enabled(ctx, slog.LevelDebug) {
		d.log.DebugContext(ctx, "dispatch: candidates", "template", req.TemplateID, "built_on", builtOn, "order", describe(cands, req.TemplateID))
	}
	if len(cands) == 0 {
		return store.Sandbox{}, fmt.Errorf("%w: no node is ready to take sandboxes (`warren nodes` shows their states)", sandbox.ErrNoCapacity)
	}
	var refusals []string
	diskFull := 0     // refusals for the disk reserve
	var missing error // a node's "no such template"
	for i, n := range cands {
		if i > 0 {
			d.mu.Lock()
			d.inflight[n.Name]++
			d.mu.Unlock()
		}
		rec, err := d.client(n).Create(ctx, req)
		d.mu.Lock()
		d.inflight[n.Name]--
		if err == nil {
			d.placed[n.Name] = append(d.placed[n.Name], d.cfg.Now())
			// Its first command comes next: the proxy knows the way.
			d.routes[rec.ID] = route{node: n.Name, addr: n.Address, at: d.cfg.Now()}
		}
		d.mu.Unlock()
		if err == nil {
			d.log.DebugContext(ctx, "dispatch: placed", "sandbox", rec.ID, "node", n.Name, "template", req.TemplateID)
			return rec, nil
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The placement's time is up (a node that hangs): no other
			// node is tried, and the caller hears it as a timeout, not as
			// a node that was unavailable.
			return store.Sandbox{}, fmt.Errorf("%w: the sandbox was not placed within %s (node %s: %v)", context.DeadlineExceeded, d.cfg.PlacementTimeout, n.Name, err)
		}
		switch {
		case errors.Is(err, sandbox.ErrTemplateNotFound):
			// The template's layers are on another node (a snapshot's
			// on its sandbox's), or nowhere.
			missing = err
			d.log.InfoContext(ctx, "dispatch: node lacks the template, trying the next", "node", n.Name, "err", err)
			continue
		case !errors.Is(err, sandbox.ErrNoCapacity) && !errors.Is(err, sandbox.ErrNodeUnavailable):
			// The remaining candidates were never reserved.
			return store.Sandbox{}, err
		}
		d.log.InfoContext(ctx, "dispatch: node did not take the sandbox, trying the next", "node", n.Name, "err", err)
		refusals = append(refusals, n.Name+": "+err.Error())
		diskFull += btoi(errors.Is(err, sandbox.ErrDiskFull))
	}
	if missing != nil && len(refusals) == 0 {
		return store.Sandbox{}, missing
	}
	if diskFull > 0 && diskFull == len(refusals) {
		// Every node is below its disk reserve: 507, as one node's is.
		return store.Sandbox{}, fmt.Errorf("%w: %w: no node has disk room for the sandbox now (%s)", sandbox.ErrNoCapacity, sandbox.ErrDiskFull, strings.Join(refusals, "; "))
	}
	return store.Sandbox{}, fmt.Errorf("%w: no node can take the sandbox now (%s)", sandbox.ErrNoCapacity, strings.Join(refusals, "; "))
}

// describe is a log's view of candidates: each node with the sandboxes
// and the warm ones of template its last heartbeat counted.
func describe(ns []store.Node, template string) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = fmt.Sprintf("%s(held %d, warm %d)", n.Name, n.Sandboxes, n.Warm[template])
	}
	return strings.Join(parts, " ")
}

// homeFirst moves node name to the front of ns, if it is there.
func homeFirst(ns []store.Node, name string) []store.Node {
	for i, n := range ns {
		if n.Name == name {
			out := append([]store.Node{n}, ns[:i]...)
			return append(out, ns[i+1:]...)
		}
	}
	return ns
}

// warmFirst moves the nodes that hold a warm sandbox of template, more
// than the creates sent there since their heartbeat would have claimed,
// to the front of ns, keeping the order within both groups: a burst
// claims the warm sandboxes it finds, then spreads as before.
func warmFirst(ns []store.Node, template string, sent func(store.Node) int) []store.Node {
	out := make([]store.Node, 0, len(ns))
	warm := func(n store.Node) bool { return n.Warm[template] > sent(n) }
	for _, n := range ns {
		if warm(n) {
			out = append(out, n)
		}
	}
	for _, n := range ns {
		if !warm(n) {
			out = append(out, n)
		}
	}
	return out
}

// pendingLocked is how many sandboxes node n holds beyond its last
// heartbeat's count: creates sent there since (sentLocked), less the
// sandboxes this api freed there since.
func (d *Dispatcher) pendingLocked(n store.Node) int {
	d.freed[n.Name] = since(d.freed[n.Name], n.HeartbeatAt)
	return d.sentLocked(n) - len(d.freed[n.Name])
}

// sentLocked is how many creates this api sent to node n since its last
// heartbeat: under way, or placed after it. Each may have claimed one of
// the warm sandboxes the heartbeat counted. (A sandbox freed there since
// makes no warm one: a kill counts against the load, never for warmth.)
func (d *Dispatcher) sentLocked(n store.Node) int {
	d.placed[n.Name] = since(d.placed[n.Name], n.HeartbeatAt)
	return d.inflight[n.Name] + len(d.placed[n.Name])
}

// since keeps the times of ts after t.
func since(ts []time.Time, t time.Time) []time.Time {
	kept := ts[:0]
	for _, x := range ts {
		if x.After(t) {
			kept = append(kept, x)
		}
	}
	return kept
}

// freedOn records that a sandbox of node left it (killed or paused).
func (d *Dispatcher) freedOn(node string) {
	d.mu.Lock()
	d.freed[node] = append(d.freed[node], d.cfg.Now())
	d.mu.Unlock()
}

func (d *Dispatcher) Kill(ctx context.Context, teamID team.ID, id string) error {
	c, node, err := d.onNode(ctx, teamID, id)
	if err != nil {
		// Paused in the blob store by a lost node: another node removes
		// it from the shared stores (resume.go).
		if rec, cands, merr := d.movable(ctx, teamID, id, err); merr == nil {
			return d.killAway(ctx, teamID, rec, cands)
		}
		return err
	}
	d.forget(id)
	if err := c.Kill(ctx, teamID, id); err != nil {
		return err
	}
	d.freedOn(node)
	return nil
}

func (d *Dispatcher) SetTimeout(ctx context.Context, teamID team.ID, id string, timeout time.Duration) error {
	c, err := d.on(ctx, teamID, id)
	if err != nil {
		return err
	}
	return c.SetTimeout(ctx, teamID, id, timeout)
}

func (d *Dispatcher) Refresh(ctx context.Context, teamID team.ID, id string, dur time.Duration) error {
	c, err := d.on(ctx, teamID, id)
	if err != nil {
		return err
	}
	return c.Refresh(ctx, teamID, id, dur)
}

// Connect resumes a paused sandbox into a place in its team's limit
// (claims.go); at the limit it only connects to a running one.
func (d *Dispatcher) Connect(ctx context.Context, teamID team.ID, id string, timeout time.Duration, memory bool) (store.Sandbox, bool, error) {
	rec, n, err := d.find(ctx, teamID, id)
	if err != nil {
		rec, cands, merr := d.movable(ctx, teamID, id, err)
		if merr != nil {
			return store.Sandbox{}, false, merr
		}
		release, err := d.admit(ctx, teamID)
		if err != nil {
			return store.Sandbox{}, false, err
		}
		defer release()
		var out store.Sandbox
		resumed := false
		err = d.resumeOn(ctx, rec, cands, func(c *noderpc.Client) (err error) {
			out, resumed, err = c.Connect(ctx, teamID, id, timeout, memory)
			return err
		})
		return out, resumed, err
	}
	c := d.client(n)
	release, err := d.admit(ctx, teamID)
	if errors.Is(err, sandbox.ErrTeamLimit) {
		rec, err := d.connectRunning(ctx, c, teamID, rec, timeout, err)
		return rec, false, err
	}
	if err != nil {
		return store.Sandbox{}, false, err
	}
	defer release()
	if inBlobStore(rec) && n.State != store.NodeReady {
		// A drained (or cordoned) node's paused sandboxes resume
		// elsewhere from the store.
		var out store.Sandbox
		resumed := false
		err := d.resumeOn(ctx, rec, d.others(ctx, n.Name), func(c *noderpc.Client) (err error) {
			out, resumed, err = c.Connect(ctx, teamID, id, timeout, memory)
			return err
		})
		return out, resumed, err
	}
	out, resumed, err := c.Connect(ctx, teamID, id, timeout, memory)
	if errors.Is(err, sandbox.ErrNoCapacity) && inBlobStore(rec) {
		// Its node has no room: any other may take it from the store.
		err = d.resumeOn(ctx, rec, d.others(ctx, n.Name), func(c *noderpc.Client) (err error) {
			out, resumed, err = c.Connect(ctx, teamID, id, timeout, memory)
			return err
		})
	}
	return out, resumed, err
}

func (d *Dispatcher) Pause(ctx context.Context, teamID team.ID, id string, keepMemory bool) (bool, error) {
	c, node, err := d.onNode(ctx, teamID, id)
	if err != nil {
		return false, err
	}
	d.forget(id)
	paused, err := c.Pause(ctx, teamID, id, keepMemory)
	if paused {
		d.freedOn(node)
	}
	return paused, err
}

// ResumeSandbox resumes a paused sandbox into a place in its team's
// limit (claims.go).
func (d *Dispatcher) ResumeSandbox(ctx context.Context, teamID team.ID, id string, opts sandbox.ResumeOptions) (store.Sandbox, error) {
	rec, n, err := d.find(ctx, teamID, id)
	if err != nil {
		rec, cands, merr := d.movable(ctx, teamID, id, err)
		if merr != nil {
			return store.Sandbox{}, merr
		}
		release, err := d.admit(ctx, teamID)
		if err != nil {
			return store.Sandbox{}, err
		}
		defer release()
		var out store.Sandbox
		err = d.resumeOn(ctx, rec, cands, func(c *noderpc.Client) (err error) {
			out, err = c.Resume(ctx, teamID, id, opts)
			return err
		})
		return out, err
	}
	release, err := d.admit(ctx, teamID)
	if errors.Is(err, sandbox.ErrTeamLimit) && rec.State == store.StateRunning {
		// Nothing is resumed without a place: a running sandbox's answer
		// is the node's, without asking it.
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s is already running", sandbox.ErrConflict, id)
	}
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	if inBlobStore(rec) && n.State != store.NodeReady {
		// A drained (or cordoned) node's paused sandboxes resume
		// elsewhere from the store.
		var out store.Sandbox
		err := d.resumeOn(ctx, rec, d.others(ctx, n.Name), func(c *noderpc.Client) (err error) {
			out, err = c.Resume(ctx, teamID, id, opts)
			return err
		})
		return out, err
	}
	out, err := d.client(n).Resume(ctx, teamID, id, opts)
	if errors.Is(err, sandbox.ErrNoCapacity) && inBlobStore(rec) {
		// Its node has no room: any other may take it from the store.
		err = d.resumeOn(ctx, rec, d.others(ctx, n.Name), func(c *noderpc.Client) (err error) {
			out, err = c.Resume(ctx, teamID, id, opts)
			return err
		})
	}
	return out, err
}

// Fork forks on the parent's node (the checkpoint is there), or on a
// node that takes it over from the blob store when its node is lost
// (fork.go), as many children as the team's limit has places for; the
// others fail as their creates would (claims.go).
func (d *Dispatcher) Fork(ctx context.Context, teamID team.ID, id string, timeout time.Duration, count int) ([]sandbox.ForkResult, error) {
	cands, err := d.forkNodes(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	if count < 1 || count > sandbox.MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", sandbox.ErrInvalid, sandbox.MaxForkCount)
	}
	places, release, over, err := d.admitN(ctx, teamID, count)
	if err != nil {
		return nil, err
	}
	defer release()
	children, err := d.forkOn(ctx, cands, teamID, id, timeout, places)
	if err != nil {
		return nil, err
	}
	answered := min(len(children), places) // a node answers no more than it was asked
	out := make([]sandbox.ForkResult, count)
	for i, ch := range children[:answered] {
		if ch.Err != nil {
			out[i].Err = ch.Err
			continue
		}
		out[i].Sandbox, out[i].Err = d.cfg.Store.GetSandbox(ctx, ch.ID)
	}
	for i := answered; i < count; i++ {
		out[i].Err = over
		if i < places {
			out[i].Err = fmt.Errorf("noderpc: the node answered %d of the %d children it was asked for", len(children), places)
		}
	}
	return out, nil
}

func (d *Dispatcher) Metrics(ctx context.Context, teamID team.ID, id string, start, end time.Time) ([]sandbox.Metric, error) {
	c, err := d.on(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	return c.Metrics(ctx, teamID, id, start, end)
}

func (d *Dispatcher) Logs(ctx context.Context, teamID team.ID, id string, start time.Time, limit int) ([]sandbox.LogEntry, error) {
	c, err := d.on(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	return c.Logs(ctx, teamID, id, start, limit)
}

func (d *Dispatcher) UpdateNetwork(ctx context.Context, teamID team.ID, id string, u sandbox.NetworkUpdate) error {
	c, err := d.on(ctx, teamID, id)
	if err != nil {
		return err
	}
	return c.UpdateNetwork(ctx, teamID, id, u)
}

func (d *Dispatcher) NetworkLogs(ctx context.Context, teamID team.ID, id string, start time.Time, limit int) ([]egress.Entry, error) {
	c, err := d.on(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	return c.NetworkLogs(ctx, teamID, id, start, limit)
}

// Locate is the name and internal address of the node that runs sandbox
// id, for the proxy: proxy.ErrNotFound when it is gone, paused without
// resuming on traffic, or on a lost node. Answers are reused for
// routeTTL.
func (d *Dispatcher) Locate(ctx context.Context, id string) (node, addr string, err error) {
	now := d.cfg.Now()
	d.mu.Lock()
	r, ok := d.routes[id]
	d.mu.Unlock()
	if ok && now.Sub(r.at) < routeTTL {
		return r.node, r.addr, nil
	}
	rec, err := d.cfg.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !routable(rec)) {
		return "", "", proxy.ErrNotFound
	}
	if err != nil {
		return "", "", err
	}
	n, err := d.liveNode(ctx, rec.Node, id)
	if err != nil {
		return "", "", proxy.ErrNotFound
	}
	d.mu.Lock()
	if len(d.routes) > 10000 { // bounded: old entries are only a cache
		clear(d.routes)
	}
	d.routes[id] = route{node: n.Name, addr: n.Address, at: now}
	d.mu.Unlock()
	return n.Name, n.Address, nil
}

// routable: the proxy reaches a running sandbox, and a paused one that
// resumes on traffic.
func routable(rec store.Sandbox) bool {
	return rec.State == store.StateRunning || rec.State == store.StatePaused && rec.AutoResume
}

func (d *Dispatcher) forget(id string) {
	d.mu.Lock()
	delete(d.routes, id)
	d.mu.Unlock()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
