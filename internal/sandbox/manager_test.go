package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// The manager tests run real sandboxes (runc, for speed) from the base
// template `warren setup` builds, in a data dir of their own that shares
// its layers, so that their cleanup never meets another test's sandboxes.

var (
	fixtureOnce sync.Once
	fixtureErr  error
	envdPath    string
	dataDir     string
)

func setupFixture(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs real sandboxes")
	}
	if testing.Short() {
		t.Skip("runs real sandboxes: not in -short (make check)")
	}
	fixtureOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		if fixtureErr = setup.Run(ctx, setup.Options{Runtimes: []string{"runc", "runsc"}}, os.Stderr); fixtureErr != nil {
			return
		}
		dir, err := os.MkdirTemp("", "warren-sandbox-test-")
		if err != nil {
			fixtureErr = err
			return
		}
		dataDir = dir
		for _, p := range []string{"layers", "templates"} {
			if fixtureErr = os.Symlink(filepath.Join(setup.DefaultDataDir, p), filepath.Join(dir, p)); fixtureErr != nil {
				return
			}
		}
		envdPath, fixtureErr = testenv.BuildEnvd(dir)
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
}

// env is one "run" of warren: a store that outlives it, and a node and
// manager that do not.
type env struct {
	t     *testing.T
	store store.Store
	nw    *network.Manager
	mgr   *Manager
}

func newStore(t *testing.T) store.Store {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.CreateTeam(context.Background(), store.Team{ID: "t1", Name: "t1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return st
}

func start(t *testing.T, st store.Store, cfg Config) *env {
	t.Helper()
	return startWith(t, st, cfg, envOptions{})
}

// envOptions choose a run's runtime: runc by default (fast), runsc where
// checkpoints are needed; wrap, if set, wraps it (to make it fail).
type envOptions struct {
	runtime string
	wrap    func(runtime.Runtime) runtime.Runtime
	tuning  *poolTuning // the pools' sizing policy, if not the default
}

func startWith(t *testing.T, st store.Store, cfg Config, o envOptions) *env {
	t.Helper()
	setupFixture(t)
	if o.runtime == "" {
		o.runtime = "runc"
	}
	rcfg := runtime.Config{StateDir: "/run/warren-sandbox-test/" + o.runtime, CgroupParent: "/warren-sandbox-test"}
	if o.runtime == "runsc" {
		rcfg.Binary = setup.RunscPath(setup.DefaultDataDir)
	}
	rt, err := runtime.New(o.runtime, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.wrap != nil {
		rt = o.wrap(rt)
	}
	// A range of its own: internal/network's tests use 10.123.0.0/16 and
	// run side by side with these; two packages' slots in one range route
	// each other's replies to the wrong veth.
	nw, err := network.New(network.Config{CIDR: netip.MustParsePrefix("10.125.0.0/20"), Prefix: "wst", PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	testenv.SweepOnce(t, "prefix wst", func() error { return nw.Cleanup(nil) })
	images, err := image.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := rootfs.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Runtime: rt, Network: nw, Rootfs: node.LocalRootfs(roots, images), EnvdPath: envdPath, ResolvConf: "/etc/resolv.conf"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Node, cfg.Images = st, n, images
	cfg.Resources = Resources{CPUCount: 1, MemoryMB: 256, DiskSizeMB: 256}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.tuning != nil {
		m.tuning = *o.tuning
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, store: st, nw: nw, mgr: m}
	return e
}

// stop ends the run without touching its sandboxes, like SIGTERM.
func (e *env) stop() {
	if err := e.mgr.Close(); err != nil {
		e.t.Error(err)
	}
	if err := e.nw.Close(); err != nil {
		e.t.Error(err)
	}
}

// destroy kills every sandbox and removes the network.
func (e *env) destroy() {
	ctx := context.Background()
	e.mgr.mu.Lock()
	var ids []string
	for id := range e.mgr.live {
		ids = append(ids, id)
	}
	e.mgr.mu.Unlock()
	for _, id := range ids {
		l, err := e.mgr.lookup(store.AllTeams(), id)
		if err == nil {
			err = e.mgr.kill(ctx, l)
		}
		if err != nil {
			e.t.Errorf("kill %s: %v", id, err)
		}
	}
	e.mgr.Close()
	if err := e.nw.Destroy(); err != nil {
		e.t.Error(err)
	}
}

func (e *env) create(req CreateRequest) (store.Sandbox, error) {
	if req.TeamID.IsZero() {
		req.TeamID = team.MustParse("t1")
	}
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return e.mgr.Create(ctx, req)
}

// waitWarm waits until the warm pools hold n sandboxes, at most 30 s.
func (e *env) waitWarm(n int) {
	e.t.Helper()
	if !poll.Within(30*time.Second, 20*time.Millisecond, func() bool { _, warm := e.mgr.Count(); return warm == n }) {
		e.t.Fatalf("the warm pool did not reach %d sandboxes within 30 s", n)
	}
}

// envdEnv asks envd for its default environment, with the sandbox's token.
func envdEnv(t *testing.T, m *Manager, rec store.Sandbox) (int, string) {
	l, err := m.lookup(store.AllTeams(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Straight to envd, as the proxy does: once its /init is done.
	if err := l.initialised(context.Background()); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", l.inst.EnvdURL()+"/envs", nil)
	req.Header.Set("X-Access-Token", rec.EnvdAccessToken)
	res, err := l.transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, 4096)
	n, _ := res.Body.Read(buf)
	return res.StatusCode, string(buf[:n])
}

func TestWarmPoolClaimPushesIdentityEnvsAndToken(t *testing.T) {
	e := start(t, newStore(t), Config{PoolSize: 1})
	defer e.destroy()
	e.waitWarm(1)
	e.mgr.mu.Lock()
	w := <-e.mgr.pools["base"].ready
	e.mgr.pools["base"].ready <- w // peek
	e.mgr.mu.Unlock()
	rec, err := e.create(CreateRequest{EnvVars: map[string]string{"FOO": "bar"}})
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID != w.inst.ID {
		t.Errorf("created %s, not the warm %s", rec.ID, w.inst.ID)
	}
	status, body := envdEnv(t, e.mgr, rec)
	if status != 200 {
		t.Fatalf("envd /envs with the new token: %d %s", status, body)
	}
	for _, want := range []string{`"FOO":"bar"`, `"E2B_SANDBOX_ID":"` + rec.ID + `"`, `"E2B_SANDBOX":"true"`} {
		if !strings.Contains(body, want) {
			t.Errorf("envs %s lack %s", body, want)
		}
	}
	// The pool's private token no longer opens envd.
	stale := rec
	stale.EnvdAccessToken = w.token
	if status, _ := envdEnv(t, e.mgr, stale); status != http.StatusUnauthorized {
		t.Errorf("the warm token still works: %d", status)
	}
	got, err := e.store.GetSandbox(context.Background(), rec.ID)
	if err != nil || got.State != store.StateRunning || got.Slot == "" {
		t.Errorf("record %+v, %v", got, err)
	}
}

// heldInit makes a manager's /init of created sandboxes wait for release
// (or its context) before it goes on, and then return fail if set.
type heldInit struct {
	release chan struct{}
	started chan string // the sandbox whose /init began
	ended   chan error  // its context's error when it ended
	fail    error
}

func holdInit(m *Manager) *heldInit {
	h := &heldInit{release: make(chan struct{}), started: make(chan string, 10), ended: make(chan error, 10)}
	real := m.initCreated
	m.initCreated = func(ctx context.Context, inst *node.Instance, rt http.RoundTripper, token string, rec store.Sandbox, envs map[string]string) error {
		h.started <- rec.ID
		select {
		case <-h.release:
		case <-ctx.Done():
			h.ended <- ctx.Err()
			return ctx.Err()
		}
		h.ended <- nil
		if h.fail != nil {
			return h.fail
		}
		return real(ctx, inst, rt, token, rec, envs)
	}
	return h
}

// A create answers before envd's /init is done (it runs meanwhile); the
// proxy's Resolve holds the sandbox's traffic until it is, and then envd
// has the sandbox's token and identity.
func TestCreateAnswersWhileEnvdInitsAndTrafficWaits(t *testing.T) {
	e := start(t, newStore(t), Config{PoolSize: 1})
	defer e.destroy()
	e.waitWarm(1)
	h := holdInit(e.mgr)
	rec, err := e.create(CreateRequest{EnvVars: map[string]string{"FOO": "bar"}})
	if err != nil {
		t.Fatal(err)
	}
	if id := <-h.started; id != rec.ID {
		t.Fatalf("init of %s, created %s", id, rec.ID)
	}
	resolved := make(chan error, 1)
	go func() {
		_, err := e.mgr.Resolve(context.Background(), rec.ID)
		resolved <- err
	}()
	select {
	case err := <-resolved:
		t.Fatalf("Resolve answered (%v) before envd was initialised", err)
	case <-time.After(200 * time.Millisecond):
	}
	// A client that gives up waiting gets its context's error.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := e.mgr.Resolve(ctx, rec.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Resolve with a context that ends during the init: %v", err)
	}
	close(h.release)
	if err := <-resolved; err != nil {
		t.Fatalf("Resolve after the init: %v", err)
	}
	status, body := envdEnv(t, e.mgr, rec)
	if status != 200 || !strings.Contains(body, `"FOO":"bar"`) || !strings.Contains(body, `"E2B_SANDBOX_ID":"`+rec.ID+`"`) {
		t.Errorf("envd /envs with the sandbox's token right after Resolve: %d %s", status, body)
	}
}

// A sandbox whose envd cannot be initialised is removed, record and all;
// its traffic finds no sandbox.
func TestFailedEnvdInitRemovesTheSandbox(t *testing.T) {
	e := start(t, newStore(t), Config{})
	defer e.destroy()
	h := holdInit(e.mgr)
	h.fail = errors.New("envd said no")
	close(h.release)
	rec, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Resolve(context.Background(), rec.ID); !errors.Is(err, proxy.ErrNotFound) {
		t.Errorf("Resolve of a sandbox whose init failed: %v", err)
	}
	// Its traffic found nothing at once; its removal goes on meanwhile.
	if !poll.Within(10*time.Second, 10*time.Millisecond, func() bool {
		_, err := e.store.GetSandbox(context.Background(), rec.ID)
		return errors.Is(err, store.ErrNotFound)
	}) {
		t.Error("its record is still there after 10 s")
	}
	if st, err := e.mgr.cfg.Node.State(context.Background(), rec.ID); err == nil {
		t.Errorf("its container is still there: %v", st)
	}
	if live, _ := e.mgr.Count(); live != 0 {
		t.Errorf("%d live sandboxes", live)
	}
}

// A kill during envd's /init ends the init at once and removes the
// sandbox.
func TestKillDuringEnvdInit(t *testing.T) {
	e := start(t, newStore(t), Config{})
	defer e.destroy()
	h := holdInit(e.mgr)
	rec, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	if err := e.mgr.Kill(context.Background(), team.MustParse("t1"), rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-h.ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the init ended with %v, not cancelled by the kill", err)
	}
	if got, err := e.store.GetSandbox(context.Background(), rec.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("its record: %+v %v", got, err)
	}
	if _, err := e.mgr.cfg.Node.State(context.Background(), rec.ID); err == nil {
		t.Error("its container is still there")
	}
}

func TestLimits(t *testing.T) {
	e := start(t, newStore(t), Config{MaxSandboxes: 2, MaxPerTeam: 1})
	defer e.destroy()
	if err := e.store.CreateTeam(context.Background(), store.Team{ID: "t2", Name: "t2", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create(CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create(CreateRequest{}); !errors.Is(err, ErrTeamLimit) {
		t.Errorf("second sandbox of a team with a limit of 1: %v", err)
	}
	if _, err := e.create(CreateRequest{TeamID: team.MustParse("t2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create(CreateRequest{TeamID: team.MustParse("t3")}); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("third sandbox on a node with a limit of 2: %v", err)
	}
	if _, err := e.create(CreateRequest{TeamID: team.MustParse("t3"), TemplateID: "nope"}); !errors.Is(err, ErrTemplateNotFound) {
		t.Errorf("unknown template: %v", err)
	}
	if _, err := e.create(CreateRequest{TeamID: team.MustParse("t3"), Timeout: -time.Second}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative timeout: %v", err)
	}
	if live, _ := e.mgr.Count(); live != 2 {
		t.Errorf("%d live sandboxes, want 2: a refused create left one", live)
	}
}

func TestReaperKillsExpired(t *testing.T) {
	e := start(t, newStore(t), Config{ReapInterval: 100 * time.Millisecond})
	defer e.destroy()
	rec, err := e.create(CreateRequest{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	keep, err := e.create(CreateRequest{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := e.mgr.SetTimeout(ctx, team.MustParse("t1"), rec.ID, 0); err != nil {
		t.Fatal(err)
	}
	if !poll.Within(10*time.Second, 50*time.Millisecond, func() bool {
		_, err := e.store.GetSandbox(ctx, rec.ID)
		return errors.Is(err, store.ErrNotFound)
	}) {
		t.Fatal("the expired sandbox was not removed within 10 s")
	}
	if _, err := e.mgr.Get(ctx, team.MustParse("t1"), keep.ID); err != nil {
		t.Errorf("the other sandbox: %v", err)
	}
	if err := e.mgr.Kill(ctx, team.MustParse("t1"), rec.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("killing the reaped sandbox: %v", err)
	}
	if err := e.mgr.Kill(ctx, team.MustParse("t2"), keep.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team killed it: %v", err)
	}
}

func TestRestartAdoptsRunningAndRemovesTheRest(t *testing.T) {
	st := newStore(t)
	e := start(t, st, Config{})
	rec, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before, err := e.mgr.Logs(ctx, team.MustParse("t1"), rec.ID, time.Time{}, 0)
	if err != nil || len(before) == 0 {
		t.Fatalf("envd's log: %d entries, %v", len(before), err)
	}
	// A create interrupted by a crash leaves a "creating" record.
	half := rec
	half.ID, half.State, half.Slot = NewID(), store.StateCreating, ""
	if err := st.CreateSandbox(ctx, half); err != nil {
		t.Fatal(err)
	}
	e.stop()

	e = start(t, st, Config{})
	defer e.destroy()
	if _, err := st.GetSandbox(ctx, half.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the interrupted create's record is still there: %v", err)
	}
	got, err := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID)
	if err != nil || got.State != store.StateRunning {
		t.Fatalf("after restart: %+v, %v", got, err)
	}
	if status, body := envdEnv(t, e.mgr, rec); status != 200 {
		t.Errorf("envd of the adopted sandbox: %d %s", status, body)
	}
	// envd's log (on the sandbox's own disk) is found again.
	if after, err := e.mgr.Logs(ctx, team.MustParse("t1"), rec.ID, time.Time{}, 0); err != nil || len(after) < len(before) || after[0].Line != before[0].Line {
		t.Errorf("envd's log after the restart: %d entries (%d before), %v", len(after), len(before), err)
	}
	if err := e.mgr.Kill(ctx, team.MustParse("t1"), rec.ID); err != nil {
		t.Errorf("killing the adopted sandbox: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", rec.ID)); !os.IsNotExist(err) {
		t.Errorf("its root filesystem is left: %v", err)
	}
}

// A node refuses a create when its own data disk is below its reserve
// (in a cluster the api cannot know; it forwards the refusal as 507).
func TestCreateRefusedBelowTheNodesReserve(t *testing.T) {
	st := newStore(t)
	e := start(t, st, Config{DiskReserveMB: 2048, FreeDiskMB: func() (int64, error) { return 100, nil }})
	defer e.destroy()
	rec, err := e.create(CreateRequest{})
	if !errors.Is(err, ErrDiskFull) || !errors.Is(err, ErrNoCapacity) || !strings.Contains(fmt.Sprint(err), "100 MB free") {
		t.Fatalf("a create with 100 MB free above a 2048 MB reserve: %v (made %s)", err, rec.ID)
	}
	if l, _ := st.ListSandboxes(context.Background(), store.SandboxFilter{Teams: store.ForTeam("t1")}); len(l) != 0 {
		t.Errorf("a refused create left %d records", len(l))
	}
}
