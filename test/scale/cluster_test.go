// Package scale measures Warren's control plane with simulated nodes:
// the real api (internal/api over internal/dispatch, two replicas), the
// real node RPC (internal/noderpc, with the cluster's authentication) and
// the real heartbeats (internal/cluster) against one PostgreSQL of the
// test's own, with each node's sandbox manager replaced by a stand-in that
// writes the records a node would and runs nothing. What it measures is
// what the store, placement, listing and routing cost at a size one box
// cannot run for real (docs/scale.md has the figures).
//
// BenchmarkControlPlane (make bench-scale) is the measurement: 100 nodes,
// 10,000 running and 50,000 paused sandbox records. TestSimulatedCluster
// is a small correctness check of the same harness for make test.
package scale

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/warren-sandbox/warren/internal/api"
	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/dispatch"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/noderpc"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// postgres is a PostgreSQL server of the test's own: initdb into a
// temporary directory, listening only on a Unix socket there.
type postgres struct {
	dir  string
	DSN  string
	bin  string
	Pid  int
	stop func()
}

// pgBin finds PostgreSQL's server binaries (scripts/install-deps.sh
// installs them).
func pgBin(t testing.TB) string {
	t.Helper()
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(m) == 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("PostgreSQL's initdb is required in CI (scripts/install-deps.sh)")
		}
		t.Skip("no /usr/lib/postgresql/*/bin/initdb")
	}
	return filepath.Dir(m[len(m)-1])
}

// startPostgres starts a PostgreSQL server owned by the postgres user in
// a temporary directory (initdb refuses root), stopped at the test's end.
func startPostgres(t testing.TB) *postgres {
	t.Helper()
	bin := pgBin(t)
	dir, err := os.MkdirTemp("", "warren-scale-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Who owns it: scripts/sweep-test-leftovers.sh stops and removes the
	// server of a run that was killed (its owner gone).
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(ownerRecord()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chown", "postgres:", dir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v: %s", err, out)
	}
	asPG := func(args ...string) *exec.Cmd {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...)
	}
	data := filepath.Join(dir, "data")
	if out, err := asPG(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v: %s", err, out)
	}
	opts := fmt.Sprintf("-c listen_addresses='' -k %s -c max_connections=400 -c shared_buffers=256MB", dir)
	if os.Getenv("SCALE_PGSTAT") != "" {
		opts += " -c shared_preload_libraries=pg_stat_statements -c track_io_timing=on"
	}
	if out, err := asPG(filepath.Join(bin, "pg_ctl"), "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		t.Fatalf("pg_ctl start: %v: %s\n%s", err, out, log)
	}
	p := &postgres{dir: dir, bin: bin, DSN: fmt.Sprintf("host=%s user=postgres dbname=postgres sslmode=disable", dir)}
	p.stop = func() { asPG(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop").Run() }
	t.Cleanup(p.stop)
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	p.Pid, _ = strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	return p
}

// cpuTicks is the CPU time (user + system, in clock ticks) of the server
// and all its processes so far: the postmaster's own and that of its
// children it has reaped, and that of its live children.
func (p *postgres) cpuTicks() int64 {
	var total int64
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17)
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ppid, _ := strconv.Atoi(f[1])
		n := 2 // utime, stime
		switch {
		case pid == p.Pid:
			n = 4 // and the reaped children's
		case ppid != p.Pid:
			continue
		}
		for _, v := range f[11 : 11+n] {
			x, _ := strconv.ParseInt(v, 10, 64)
			total += x
		}
	}
	return total
}

// standIn is a node's sandbox manager that runs nothing: a create writes
// the running sandbox's record on its node, as a node does, and the calls
// about a sandbox read and change the record.
type standIn struct {
	node string
	st   store.Store
	seq  atomic.Int64
}

var _ api.Sandboxes = (*standIn)(nil)

func (f *standIn) Create(ctx context.Context, req sandbox.CreateRequest) (store.Sandbox, error) {
	now := time.Now()
	id := fmt.Sprintf("%s-%d", f.node, f.seq.Add(1))
	rec := store.Sandbox{ID: id, TeamID: req.TeamID.String(), TemplateID: req.TemplateID, State: store.StateRunning, Node: f.node,
		StartedAt: now, EndAt: now.Add(req.Timeout), EnvdAccessToken: "token-" + id, Metadata: req.Metadata,
		CPUCount: 1, MemoryMB: 256}
	return rec, f.st.CreateSandbox(ctx, rec)
}

func (f *standIn) record(ctx context.Context, team, id string) (store.Sandbox, error) {
	rec, err := f.st.GetSandbox(ctx, id)
	if err != nil || rec.TeamID != team || rec.Node != f.node {
		return store.Sandbox{}, fmt.Errorf("%w: %s", sandbox.ErrNotFound, id)
	}
	return rec, nil
}

func (f *standIn) Get(ctx context.Context, tid team.ID, id string) (store.Sandbox, error) {
	return f.record(ctx, tid.String(), id)
}

func (f *standIn) List(ctx context.Context, tid team.ID, sf store.SandboxFilter) ([]store.Sandbox, error) {
	sf.Teams, sf.Node = tid.Scope(), f.node
	return f.st.ListSandboxes(ctx, sf)
}

func (f *standIn) Kill(ctx context.Context, tid team.ID, id string) error {
	team := tid.String()
	if _, err := f.record(ctx, team, id); err != nil {
		return err
	}
	return f.st.DeleteSandbox(ctx, id)
}

func (f *standIn) SetTimeout(ctx context.Context, tid team.ID, id string, d time.Duration) error {
	team := tid.String()
	_, err := f.change(ctx, team, id, func(s *store.Sandbox) { s.EndAt = time.Now().Add(d) })
	return err
}

func (f *standIn) Refresh(ctx context.Context, tid team.ID, id string, d time.Duration) error {
	return f.SetTimeout(ctx, tid, id, d)
}

func (f *standIn) change(ctx context.Context, team, id string, c func(*store.Sandbox)) (store.Sandbox, error) {
	if _, err := f.record(ctx, team, id); err != nil {
		return store.Sandbox{}, err
	}
	return f.st.UpdateSandbox(ctx, id, func(s *store.Sandbox) error { c(s); return nil })
}

func (f *standIn) Connect(ctx context.Context, tid team.ID, id string, d time.Duration, memory bool) (store.Sandbox, bool, error) {
	team := tid.String()
	rec, err := f.record(ctx, team, id)
	if err != nil || rec.State == store.StateRunning {
		return rec, false, err
	}
	rec, err = f.change(ctx, team, id, func(s *store.Sandbox) { s.State = store.StateRunning })
	return rec, true, err
}

func (f *standIn) Pause(ctx context.Context, tid team.ID, id string, keep bool) (bool, error) {
	team := tid.String()
	_, err := f.change(ctx, team, id, func(s *store.Sandbox) { s.State = store.StatePaused })
	return true, err
}

func (f *standIn) ResumeSandbox(ctx context.Context, tid team.ID, id string, o sandbox.ResumeOptions) (store.Sandbox, error) {
	rec, _, err := f.Connect(ctx, tid, id, o.Timeout, true)
	return rec, err
}

func (f *standIn) Fork(ctx context.Context, _ team.ID, id string, d time.Duration, count int) ([]sandbox.ForkResult, error) {
	return nil, errors.New("scale: the stand-in does not fork")
}

func (f *standIn) Metrics(ctx context.Context, _ team.ID, id string, start, end time.Time) ([]sandbox.Metric, error) {
	return nil, nil
}

func (f *standIn) Logs(ctx context.Context, _ team.ID, id string, start time.Time, limit int) ([]sandbox.LogEntry, error) {
	return nil, nil
}

func (f *standIn) UpdateNetwork(ctx context.Context, _ team.ID, id string, u sandbox.NetworkUpdate) error {
	return nil
}

func (f *standIn) NetworkLogs(ctx context.Context, _ team.ID, id string, start time.Time, limit int) ([]egress.Entry, error) {
	return nil, nil
}

// simCluster is the simulated cluster: a store, nodes heartbeating, and
// api replicas.
type simCluster struct {
	pg      *postgres
	st      store.Store
	team    string
	apiKey  string
	apis    []*httptest.Server
	disps   []*dispatch.Dispatcher
	members map[string]*cluster.Member
	nodeSrv map[string]*httptest.Server
	client  *http.Client
	// running are the IDs of the running records seed wrote.
	running []string
}

// simConfig sizes a simulated cluster.
type simConfig struct {
	Nodes, APIs int
	Heartbeat   time.Duration
}

// newSimCluster starts PostgreSQL, registers cfg.Nodes stand-in nodes
// that heartbeat every cfg.Heartbeat through the real cluster.Member, and
// serves the real api with cfg.APIs replicas.
func newSimCluster(t testing.TB, cfg simConfig) *simCluster {
	t.Helper()
	ctx := context.Background()
	pg := startPostgres(t)
	st, err := store.OpenPostgres(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	creds, err := auth.Bootstrap(ctx, st, t.TempDir(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 32)
	copy(secret, "scale-test-cluster-secret-012345")
	ca, err := cluster.NewAuth(secret)
	if err != nil {
		t.Fatal(err)
	}
	c := &simCluster{pg: pg, st: st, team: auth.DefaultTeamID, apiKey: creds.APIKey,
		members: map[string]*cluster.Member{}, nodeSrv: map[string]*httptest.Server{},
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}}
	teams := &noderpc.StoreTeams{Store: st}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range cfg.Nodes {
		name := fmt.Sprintf("sim%03d", i)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f := &standIn{node: name, st: st}
			srv := httptest.NewServer(noderpc.Handler(noderpc.Served{Sandboxes: f, Teams: teams,
				Traffic: http.NotFoundHandler()}, ca.Guard(name)))
			m, err := cluster.Join(ctx, cluster.Config{Store: st, Heartbeat: cfg.Heartbeat,
				Node: store.Node{Name: name, Address: strings.TrimPrefix(srv.URL, "http://"), Runtime: "runsc",
					CPUs: 64, MemoryMB: 256 << 10, MaxSandboxes: 1000, DiskMB: 1 << 20},
				Usage: func() store.NodeUsage { return store.NodeUsage{FreeDiskMB: 1 << 19} }})
			if err != nil {
				srv.Close()
				t.Error(err)
				return
			}
			mu.Lock()
			c.members[name], c.nodeSrv[name] = m, srv
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		for _, m := range c.members {
			m.Close()
		}
		for _, s := range c.nodeSrv {
			s.Close()
		}
	})
	// A failed request's cause goes to the test's output.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for range cfg.APIs {
		d, err := dispatch.New(dispatch.Config{Store: st, Transport: noderpc.NewTransport(ca), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(api.New(api.Config{Store: st, Sandboxes: d, ClientID: "api", Logger: log}))
		t.Cleanup(srv.Close)
		c.apis = append(c.apis, srv)
		c.disps = append(c.disps, d)
	}
	return c
}

// do sends an API request to replica i and returns its status, body
// and X-Total-Running / X-Next-Token headers.
func (c *simCluster) do(i int, method, path, body string) (int, []byte, http.Header, error) {
	var rd *strings.Reader
	if body != "" {
		rd = strings.NewReader(body)
	} else {
		rd = strings.NewReader("")
	}
	req, err := http.NewRequest(method, c.apis[i%len(c.apis)].URL+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("X-API-Key", c.apiKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer res.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return res.StatusCode, []byte(b.String()), res.Header, nil
}

// seed writes running and paused sandbox records of the team spread over
// the nodes, oldest first, with a metadata pair of 10 values.
func (c *simCluster) seed(t testing.TB, running, paused int) {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("pgx", c.pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	nodes := make([]string, 0, len(c.members))
	for n := range c.members {
		nodes = append(nodes, n)
	}
	start := time.Now().Add(-time.Hour)
	total := running + paused
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += 16 {
				state := store.StatePaused
				if i*running/total != (i+1)*running/total {
					state = store.StateRunning
				}
				at := start.Add(time.Duration(i) * 50 * time.Millisecond)
				rec := store.Sandbox{ID: fmt.Sprintf("seed%06d", i), TeamID: c.team, TemplateID: "base", State: state,
					Node: nodes[i%len(nodes)], StartedAt: at, EndAt: at.Add(24 * time.Hour), EnvdAccessToken: "t",
					Metadata: map[string]string{"shard": strconv.Itoa(i % 10)}, CPUCount: 1, MemoryMB: 256}
				if state == store.StatePaused {
					rec.PausedAt = at.Add(time.Minute)
				}
				if err := c.st.CreateSandbox(ctx, rec); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range total {
		if i*running/total != (i+1)*running/total {
			c.running = append(c.running, fmt.Sprintf("seed%06d", i))
		}
	}
	if _, err := db.ExecContext(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
}

// ownerRecord is "pid starttime" of this process (starttime: field 22 of
// /proc/self/stat), which tells it from a later process given its pid.
func ownerRecord() string {
	b, _ := os.ReadFile("/proc/self/stat")
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		if f := strings.Fields(s[i+1:]); len(f) > 19 {
			return fmt.Sprintf("%d %s\n", os.Getpid(), f[19])
		}
	}
	return fmt.Sprintf("%d\n", os.Getpid())
}
