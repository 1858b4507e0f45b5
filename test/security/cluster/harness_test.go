package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/test/security/internal/seckit"
)

// The cluster's names: nothing else on the machine uses them.
var nodeSpecs = []struct{ name, cidr string }{
	{"wsca", "10.151.0.0/16"},
	{"wscb", "10.152.0.0/16"},
}

// tlsHosts are the loopback addresses of the api replicas' HTTPS proxies
// (apart from test/security's 127.0.0.8).
var tlsHosts = []string{"127.0.0.21", "127.0.0.22"}

const (
	// apisSeeNodesAfter is how long an api may take to see a change of
	// the nodes' table (it keeps the list for half a second).
	apisSeeNodesAfter = time.Second
	pgAdminDSN        = "host=/var/run/postgresql user=root dbname=postgres sslmode=disable"
	// appPort is where the victim's own web app listens in its sandbox.
	appPort  = 8000
	envdPort = seckit.EnvdPort
)

// C is the cluster the tests attack.
var C *clusterRun

type clusterRun struct {
	warren, envd string
	db, storeURL string
	secret       []byte
	volumeRoot   string
	nodes        []*proc
	apis         []*proc
	// victim is team A's sandbox on the first node, running a web app;
	// attacker is team B.
	teamA, teamB team
	victim       *sandbox
	st           store.Store
}

type team struct{ id, key string }

type sandbox struct {
	ID, EnvdToken string
	team          team
}

// proc is a running `warren serve`.
type proc struct {
	name, role       string
	args             []string
	proc             *seckit.Proc
	logPath, dataDir string
	// nodeAddr is a node's internal address; apiURL, proxyURL and
	// tlsAddr an api's.
	nodeAddr, apiURL, proxyURL, tlsAddr string
	prefix, runDir, cgroupParent        string
}

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) (code int) {
	if os.Geteuid() != 0 {
		fmt.Println("test/security/cluster: skipped: the adversarial suite runs real sandboxes and needs root")
		return 0
	}
	flag.Parse() // testing.Short reads the flags, which m.Run would parse later
	if testing.Short() {
		fmt.Println("test/security/cluster: skipped by -short (make check): the adversarial suite runs real sandboxes")
		return 0
	}
	start := time.Now()
	c, err := startCluster()
	if c != nil {
		C = c
		defer func() {
			if r := recover(); r != nil {
				fmt.Fprintln(os.Stderr, "test/security/cluster: panic:", r)
				code = 1
			}
			if err := c.teardown(); err != nil {
				fmt.Fprintln(os.Stderr, "test/security/cluster: after the suite:", err)
				code = 1
			}
			for _, p := range append(c.apis, c.nodes...) {
				if code != 0 || testing.Verbose() {
					fmt.Fprintf(os.Stderr, "test/security/cluster: %s log: %s\n", p.name, p.logPath)
				} else {
					os.Remove(p.logPath)
				}
			}
			fmt.Printf("test/security/cluster: the suite took %s\n", time.Since(start).Round(time.Second))
		}()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/security/cluster:", err)
		return 1
	}
	return m.Run()
}

func startCluster() (*clusterRun, error) {
	repo, err := filepath.Abs("../../..")
	if err != nil {
		return nil, err
	}
	c := &clusterRun{warren: filepath.Join(repo, "bin", "warren"), envd: filepath.Join(repo, "bin", "envd")}
	if b := os.Getenv("WARREN_SEC_BIN"); b != "" {
		c.warren = b
	}
	currentWarren = c.warren
	for _, p := range []string{c.warren, c.envd} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s is missing: run `make build` first", p)
		}
	}
	for _, p := range []string{"bin/runsc", "layers", "templates/base.json"} {
		if _, err := os.Stat(filepath.Join(seckit.Installed, p)); err != nil {
			return nil, fmt.Errorf("%s/%s is missing: run `make setup` first", seckit.Installed, p)
		}
	}
	admin, err := sql.Open("pgx", pgAdminDSN)
	if err == nil {
		err = admin.Ping()
	}
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL is needed (scripts/install-deps.sh installs and starts it): %w", err)
	}
	defer admin.Close()
	c.db = "warren_sec_cluster_" + randHex(6)
	if _, err := admin.Exec("CREATE DATABASE " + c.db); err != nil {
		return nil, err
	}
	c.storeURL = "postgres:///" + c.db + "?host=/var/run/postgresql&user=root&sslmode=disable"
	c.secret = []byte(randHex(32))
	c.teamA = team{id: auth.DefaultTeamID, key: "e2b_" + randHex(20)}
	if c.volumeRoot, err = os.MkdirTemp("", "warren-sec-cluster-volumes-"); err != nil {
		return c, err
	}
	env := []string{"WARREN_CLUSTER_SECRET=" + string(c.secret), "WARREN_API_KEY=" + c.teamA.key}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WARREN_") {
			env = append(env, kv)
		}
	}
	shared := []string{"--store", c.storeURL, "--volume-root", c.volumeRoot, "--volume-quota", "0", "--log-format", "text", "--log-level", "debug"}
	for _, n := range nodeSpecs {
		dataDir, err := seckit.NewDataDir(0)
		if err != nil {
			return c, err
		}
		port, err := seckit.FreePort()
		if err != nil {
			return c, err
		}
		p := &proc{name: n.name, role: "node", dataDir: dataDir, nodeAddr: fmt.Sprintf("127.0.0.1:%d", port),
			prefix: n.name, runDir: "/run/warren-" + n.name, cgroupParent: "/warren-" + n.name}
		p.args = append([]string{"serve", "--role", "node", "--data-dir", dataDir, "--node-name", n.name, "--node-addr", p.nodeAddr,
			"--network-prefix", n.name, "--network-cidr", n.cidr, "--run-dir", p.runDir, "--cgroup-parent", p.cgroupParent,
			"--pool-size", "0", "--envd", c.envd}, shared...)
		c.nodes = append(c.nodes, p)
	}
	errc := make(chan error, len(c.nodes))
	for _, p := range c.nodes {
		go func() { errc <- p.start(env, "http://"+p.nodeAddr+"/health") }()
	}
	for range c.nodes {
		if e := <-errc; e != nil {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		return c, err
	}
	for i := range 2 {
		dataDir, err := os.MkdirTemp("", "warren-sec-cluster-api-")
		if err != nil {
			return c, err
		}
		ports := make([]int, 3)
		for j := range ports {
			if ports[j], err = seckit.FreePort(); err != nil {
				return c, err
			}
		}
		p := &proc{name: fmt.Sprintf("api%d", i), role: "api", dataDir: dataDir,
			apiURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), proxyURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
			tlsAddr: fmt.Sprintf("%s:%d", tlsHosts[i], ports[2])}
		p.args = append([]string{"serve", "--role", "api", "--data-dir", dataDir,
			"--api-addr", strings.TrimPrefix(p.apiURL, "http://"), "--proxy-addr", strings.TrimPrefix(p.proxyURL, "http://"),
			"--proxy-tls-addr", p.tlsAddr}, shared...)
		c.apis = append(c.apis, p)
		if err := p.start(env, p.apiURL+"/health"); err != nil {
			return c, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if c.st, err = store.Open(ctx, c.storeURL); err != nil {
		return c, err
	}
	c.teamB = team{id: "sec-cluster-b"}
	if err := c.st.CreateTeam(ctx, store.Team{ID: c.teamB.id, Name: c.teamB.id, CreatedAt: time.Now()}); err != nil {
		return c, err
	}
	if _, c.teamB.key, err = auth.CreateKey(ctx, c.st, c.teamB.id, store.KindAPIKey, "security suite", ""); err != nil {
		return c, err
	}
	// The victim runs on the first node, with a web app that serves the
	// paths a node keeps for itself. Its POSTs read their body before
	// they answer: Python's plain http.server answers a POST unread and
	// closes, and the kernel then resets the connection (unread data),
	// which may destroy the answer before the node has read it — a cut
	// answer, through any proxy, that says nothing of the attacks here.
	if c.victim, err = c.createOn(ctx, c.nodes[0].name, c.teamA, 3600); err != nil {
		return c, fmt.Errorf("creating the victim sandbox: %w", err)
	}
	if r, err := c.exec(ctx, c.victim, fmt.Sprintf(`mkdir -p /tmp/www/images /tmp/www/platform && echo victim-app > /tmp/www/images/x && echo victim-app > /tmp/www/platform/x && cd /tmp/www && cat > /tmp/app.py <<'EOF'
import http.server
class App(http.server.SimpleHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_error(405)
http.server.ThreadingHTTPServer(("", %d), App).serve_forever()
EOF
(nohup python3 /tmp/app.py >/dev/null 2>&1 &)
for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:%d/images/x && exit 0; sleep 0.1; done; exit 1`, appPort, appPort)); err != nil || r.exit != 0 {
		return c, fmt.Errorf("starting the victim's web app: %v %+v", err, r)
	}
	return c, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// start runs the process and waits until url answers 200.
func (p *proc) start(env []string, url string) error {
	f, err := os.CreateTemp("", "warren-sec-cluster-"+p.name+"-*.log")
	if err != nil {
		return err
	}
	p.logPath = f.Name()
	cmd := exec.Command(currentWarren, p.args...)
	cmd.Env = env
	if p.proc, err = seckit.StartProc(cmd, f, p.name); err != nil {
		f.Close()
		return err
	}
	healthy, exited := p.proc.WaitHealthy(url, 100*time.Millisecond)
	if !healthy {
		p.stop()
		return fmt.Errorf("%s did not start (exited %v):\n%s", p.name, exited, p.logTail(3000))
	}
	return nil
}

// currentWarren is the binary the processes run (set before C is).
var currentWarren string

func (p *proc) stop() error {
	if p.proc == nil {
		return nil
	}
	defer func() { p.proc = nil }()
	if err := p.proc.Stop(); err != nil {
		return fmt.Errorf("%s %w", p.name, err)
	}
	return nil
}

func (p *proc) logTail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// teardown kills every sandbox, stops the processes, checks that the
// nodes left nothing, and drops the database.
func (c *clusterRun) teardown() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if len(c.apis) > 0 && c.apis[0].proc != nil {
		for _, tm := range []team{c.teamA, c.teamB} {
			if tm.key != "" {
				errs = append(errs, c.killAll(ctx, tm))
			}
		}
	}
	for _, p := range append(c.apis, c.nodes...) {
		errs = append(errs, p.stop())
	}
	for _, n := range c.nodes {
		errs = append(errs, n.leftovers())
		os.Remove(filepath.Join("/sys/fs/cgroup", n.cgroupParent))
		exec.Command("nft", "delete", "table", "ip", "warren_"+n.prefix).Run()
		exec.Command("nft", "delete", "table", "ip", "warren_"+n.prefix+"_nat").Run()
	}
	for _, p := range append(c.apis, c.nodes...) {
		if p.dataDir != "" {
			for _, m := range seckit.MountsBelow(p.dataDir + "/") {
				syscall.Unmount(m, syscall.MNT_DETACH)
			}
			os.RemoveAll(p.dataDir)
		}
	}
	if c.volumeRoot != "" {
		os.RemoveAll(c.volumeRoot)
	}
	if c.st != nil {
		c.st.Close()
	}
	if c.db != "" {
		if admin, err := sql.Open("pgx", pgAdminDSN); err == nil {
			_, err = admin.Exec("DROP DATABASE IF EXISTS " + c.db + " WITH (FORCE)")
			errs = append(errs, err)
			admin.Close()
		}
	}
	return errors.Join(errs...)
}

// leftovers lists what of a stopped node is still on the machine.
func (p *proc) leftovers() error {
	var found []string
	poll.Within(10*time.Second, 200*time.Millisecond, func() bool {
		found = found[:0]
		if ms := seckit.MountsBelow(p.dataDir + "/"); len(ms) > 0 {
			found = append(found, fmt.Sprintf("mounts %v", ms))
		}
		if ns := seckit.NetnsWithPrefix(p.prefix + "-"); len(ns) > 0 {
			found = append(found, fmt.Sprintf("network namespaces %v", ns))
		}
		if links := seckit.LinksWithPrefix(p.prefix + "v"); len(links) > 0 {
			found = append(found, fmt.Sprintf("veths %v", links))
		}
		if cgs := seckit.CgroupsBelow(p.cgroupParent); len(cgs) > 0 {
			found = append(found, fmt.Sprintf("cgroups %v", cgs))
		}
		if ps := seckit.ProcessesMatching(p.runDir + "/"); len(ps) > 0 {
			found = append(found, fmt.Sprintf("processes %v", ps))
		}
		return len(found) == 0
	})
	if len(found) > 0 {
		return fmt.Errorf("left behind by node %s: %s", p.name, strings.Join(found, "; "))
	}
	return nil
}

// response is an HTTP answer, its body read (at most 1 MiB).
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) String() string {
	b := r.body
	if len(b) > 300 {
		b = b[:300]
	}
	return fmt.Sprintf("%d %q", r.status, b)
}

func do(client *http.Client, req *http.Request) (response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), 30*time.Second)
	defer cancel()
	res, err := client.Do(req.WithContext(ctx))
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return response{status: res.StatusCode, header: res.Header, body: b}, err
}

// call sends a platform API request as tm to the first api.
func (c *clusterRun) call(ctx context.Context, tm team, method, path string, body any) (response, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.apis[0].apiURL+path, rd)
	if err != nil {
		return response{}, err
	}
	req.Header.Set("X-API-Key", tm.key)
	req.Header.Set("Content-Type", "application/json")
	return do(http.DefaultClient, req)
}

// createOn creates a sandbox of tm on node: the other nodes are cordoned
// meanwhile.
func (c *clusterRun) createOn(ctx context.Context, node string, tm team, timeout int) (*sandbox, error) {
	r, err := c.createOf(ctx, "base", node, tm, timeout)
	if err != nil {
		return nil, err
	}
	if r.status != http.StatusCreated {
		return nil, fmt.Errorf("create: %s", r)
	}
	sb, rec, err := c.created(ctx, r, tm)
	if err != nil {
		return nil, err
	}
	if rec.Node != node {
		return nil, fmt.Errorf("sandbox %s is on %q, not %s", sb.ID, rec.Node, node)
	}
	return sb, nil
}

// createOf asks for a sandbox of template as tm while every node but
// node is cordoned, and returns the API's answer.
func (c *clusterRun) createOf(ctx context.Context, template, node string, tm team, timeout int) (response, error) {
	for _, n := range c.nodes {
		if n.name != node {
			if err := c.nodeState(ctx, n.name, store.NodeCordoned); err != nil {
				return response{}, err
			}
			defer c.nodeState(context.Background(), n.name, store.NodeReady)
		}
	}
	time.Sleep(apisSeeNodesAfter)
	return c.call(ctx, tm, "POST", "/sandboxes", map[string]any{"templateID": template, "timeout": timeout})
}

// created is the sandbox a create's 201 answer r describes, and its
// record in the store.
func (c *clusterRun) created(ctx context.Context, r response, tm team) (*sandbox, store.Sandbox, error) {
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		return nil, store.Sandbox{}, err
	}
	rec, err := c.st.GetSandbox(ctx, out.SandboxID)
	if err != nil {
		return nil, rec, fmt.Errorf("sandbox %s: %w", out.SandboxID, err)
	}
	return &sandbox{ID: out.SandboxID, EnvdToken: out.EnvdAccessToken, team: tm}, rec, nil
}

func (c *clusterRun) nodeState(ctx context.Context, node string, s store.NodeState) error {
	out, err := exec.CommandContext(ctx, currentWarren, "nodes", map[store.NodeState]string{store.NodeCordoned: "cordon", store.NodeReady: "uncordon"}[s],
		node, "--store", c.storeURL).CombinedOutput()
	if err != nil {
		return fmt.Errorf("warren nodes %s %s: %v: %s", s, node, err, out)
	}
	return nil
}

// killAll kills every sandbox of tm.
func (c *clusterRun) killAll(ctx context.Context, tm team) error {
	ids, err := c.sandboxIDs(ctx, tm)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		r, err := c.call(ctx, tm, "DELETE", "/sandboxes/"+id, nil)
		if err == nil && r.status != http.StatusNoContent && r.status != http.StatusNotFound {
			err = fmt.Errorf("kill %s: %s", id, r)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sandboxIDs lists tm's running and paused sandboxes through the API.
func (c *clusterRun) sandboxIDs(ctx context.Context, tm team) ([]string, error) {
	r, err := c.call(ctx, tm, "GET", "/v2/sandboxes?limit=100&state=running,paused", nil)
	if err != nil {
		return nil, err
	}
	if r.status != http.StatusOK {
		return nil, fmt.Errorf("list: %s", r)
	}
	var l []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(r.body, &l); err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range l {
		ids = append(ids, s.SandboxID)
	}
	return ids, nil
}

// result is a finished command.
type result struct {
	stdout string
	exit   int
}

// exec runs script in sb through the first api's proxy and envd.
func (c *clusterRun) exec(ctx context.Context, sb *sandbox, script string) (result, error) {
	r, err := seckit.Exec(ctx, c.apis[0].proxyURL, sb.ID, sb.EnvdToken, script)
	return result{stdout: r.Stdout, exit: r.Exit}, err
}

// state is what the attacks must not change: the victim's record, and
// each team's sandboxes.
type state struct {
	victim store.Sandbox
	teams  map[string][]string
}

func (c *clusterRun) snapshot(t *testing.T) state {
	t.Helper()
	ctx := context.Background()
	rec, err := c.st.GetSandbox(ctx, c.victim.ID)
	if err != nil {
		t.Fatal(err)
	}
	s := state{victim: rec, teams: map[string][]string{}}
	for _, tm := range []team{c.teamA, c.teamB} {
		ids, err := c.sandboxIDs(ctx, tm)
		if err != nil {
			t.Fatal(err)
		}
		s.teams[tm.id] = ids
	}
	return s
}

// untouched fails the test if the victim, a team's sandboxes or a node
// changed since before: the victim still runs a command with its own
// token, its record's term and network are as they were, the nodes
// answer.
func (c *clusterRun) untouched(t *testing.T, before state) {
	t.Helper()
	after := c.snapshot(t)
	if after.victim.State != before.victim.State || !after.victim.EndAt.Equal(before.victim.EndAt) ||
		after.victim.Extra != before.victim.Extra || after.victim.EnvdAccessToken != before.victim.EnvdAccessToken {
		t.Errorf("the victim's record changed: state %s→%s, end %v→%v, extra %q→%q", before.victim.State, after.victim.State,
			before.victim.EndAt, after.victim.EndAt, before.victim.Extra, after.victim.Extra)
	}
	for id, ids := range before.teams {
		if fmt.Sprint(ids) != fmt.Sprint(after.teams[id]) {
			t.Errorf("team %s's sandboxes changed: %v → %v", id, ids, after.teams[id])
		}
	}
	if r, err := c.exec(context.Background(), c.victim, "echo alive"); err != nil || strings.TrimSpace(r.stdout) != "alive" {
		t.Errorf("the victim no longer runs a command: %v %+v", err, r)
	}
	for _, n := range c.nodes {
		if res, err := http.Get("http://" + n.nodeAddr + "/health"); err != nil {
			t.Errorf("node %s: %v", n.name, err)
		} else {
			res.Body.Close()
		}
	}
}
