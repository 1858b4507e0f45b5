package blobstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
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
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/blobstore/s3test"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/test/security/internal/seckit"
)

// nodeSpecs are the nodes with the blob store, and localNode one
// without it (the benchmark's baseline).
var (
	nodeSpecs = []struct{ name, cidr string }{
		{"wbsa", "10.163.0.0/18"},
		{"wbsb", "10.163.64.0/18"},
	}
	localNode = struct{ name, cidr string }{"wbsc", "10.163.128.0/18"}
)

const (
	pgAdminDSN = "host=/var/run/postgresql user=root dbname=postgres sslmode=disable"
	lostAfter  = 3 * time.Second
)

type cluster struct {
	warren, envd string
	db, storeURL string
	s3           *s3test.Server
	env          []string
	nodes        []*proc
	api          *proc
	st           store.Store
	apiKey       string
	otherKey     string
}

type proc struct {
	// bin is the binary it runs (default the cluster's warren).
	bin                          string
	name, dataDir, logPath, addr string
	args, extraEnv               []string
	p                            *seckit.Proc
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startCluster starts the S3 server, the database, two nodes and an api;
// nodeEnv is extra environment of the first start of each node, by name.
// With nodeEnv (even empty), the nodes run a build with the fault points
// (faultsBinary), which reads WARREN_TEST_FAULT.
func startCluster(t testing.TB, nodeEnv map[string][]string, withLocal bool) *cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runs real sandboxes: needs root")
	}
	flag.Parse()
	if testing.Short() {
		t.Skip("-short: runs real sandboxes")
	}
	repo, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{warren: filepath.Join(repo, "bin", "warren"), envd: filepath.Join(repo, "bin", "envd")}
	for _, p := range []string{c.warren, c.envd, filepath.Join(seckit.Installed, "templates/base.json")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is missing: run `make build` and `make setup` first", p)
		}
	}
	faults := ""
	if nodeEnv != nil {
		faults = faultsBinary(t, repo)
	}
	c.s3 = s3test.Start(t)
	admin, err := sql.Open("pgx", pgAdminDSN)
	if err == nil {
		err = admin.Ping()
	}
	if err != nil {
		t.Fatalf("PostgreSQL is needed (scripts/install-deps.sh installs and starts it): %v", err)
	}
	defer admin.Close()
	c.db = "warren_blobstore_" + randHex(6)
	if _, err := admin.Exec("CREATE DATABASE " + c.db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a, err := sql.Open("pgx", pgAdminDSN)
		if err == nil {
			a.Exec("DROP DATABASE IF EXISTS " + c.db + " WITH (FORCE)")
			a.Close()
		}
	})
	c.storeURL = "postgres:///" + c.db + "?host=/var/run/postgresql&user=root&sslmode=disable"
	c.apiKey = "e2b_" + randHex(20)
	secretFile := filepath.Join(t.TempDir(), "s3-secret")
	if err := os.WriteFile(secretFile, []byte(c.s3.SecretKey), 0o600); err != nil {
		t.Fatal(err)
	}
	c.env = []string{"WARREN_CLUSTER_SECRET=" + randHex(32), "WARREN_API_KEY=" + c.apiKey}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WARREN_") && !strings.HasPrefix(kv, "AWS_") {
			c.env = append(c.env, kv)
		}
	}
	shared := []string{"--store", c.storeURL, "--log-format", "text", "--log-level", "debug"}
	specs := nodeSpecs
	if withLocal {
		specs = append(specs, localNode)
	}
	for _, n := range specs {
		dataDir, err := seckit.NewDataDir(0)
		if err != nil {
			t.Fatal(err)
		}
		port, err := seckit.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		p := &proc{bin: faults, name: n.name, dataDir: dataDir, addr: fmt.Sprintf("127.0.0.1:%d", port), extraEnv: nodeEnv[n.name]}
		p.args = append([]string{"serve", "--role", "node", "--data-dir", dataDir, "--node-name", n.name, "--node-addr", p.addr,
			"--network-prefix", n.name, "--network-cidr", n.cidr, "--run-dir", "/run/warren-" + n.name, "--cgroup-parent", "/warren-" + n.name,
			"--pool-size", "0", "--envd", c.envd,
		}, shared...)
		if n == localNode {
			c.nodes = append(c.nodes, p)
			continue
		}
		p.args = append(p.args,
			"--blob-store", "s3://"+c.s3.Bucket+"/warren", "--blob-store-endpoint", "http://"+c.s3.Endpoint,
			"--blob-store-region", "us-east-1", "--blob-store-path-style",
			"--blob-store-access-key", c.s3.AccessKey, "--blob-store-secret-key-file", secretFile)
		if n == nodeSpecs[0] {
			// A keeps at most 1 MiB of paused sandboxes beside the store.
			p.args = append(p.args, "--blob-cache-mb", "1")
		}
		c.nodes = append(c.nodes, p)
	}
	t.Cleanup(func() { c.teardown(t) })
	for _, p := range c.nodes {
		if err := c.start(p, "http://"+p.addr+"/health"); err != nil {
			t.Fatal(err)
		}
	}
	dataDir := t.TempDir()
	ports := make([]int, 2)
	for i := range ports {
		if ports[i], err = seckit.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	c.api = &proc{name: "api", dataDir: dataDir, addr: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	c.api.args = append([]string{"serve", "--role", "api", "--data-dir", dataDir, "--api-addr", c.api.addr,
		"--proxy-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--lost-after", lostAfter.String()}, shared...)
	c.api.extraEnv = []string{"PROXY_ADDR=" + fmt.Sprintf("127.0.0.1:%d", ports[1])}
	if err := c.start(c.api, "http://"+c.api.addr+"/health"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if c.st, err = store.Open(ctx, c.storeURL); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *cluster) proxyURL() string {
	return "http://" + strings.TrimPrefix(c.api.extraEnv[0], "PROXY_ADDR=")
}

// start runs p and waits until url answers.
func (c *cluster) start(p *proc, url string) error {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "warren-blobstore-"+p.name+"-"+filepath.Base(p.dataDir)+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	p.logPath = f.Name()
	bin := c.warren
	if p.bin != "" {
		bin = p.bin
	}
	cmd := exec.Command(bin, p.args...)
	cmd.Env = append(append([]string{}, c.env...), p.extraEnv...)
	if p.p, err = seckit.StartProc(cmd, f, p.name); err != nil {
		f.Close()
		return err
	}
	if healthy, exited := p.p.WaitHealthy(url, 100*time.Millisecond); !healthy {
		c.stop(p)
		return fmt.Errorf("%s did not start (exited %v):\n%s", p.name, exited, tail(p.logPath, 3000))
	}
	return nil
}

func (c *cluster) stop(p *proc) {
	if p.p != nil {
		p.p.Stop()
		p.p = nil
	}
}

// crashed waits (bounded) for node p to exit at the fault point it was
// started with; a node that never reaches it fails the test at once
// rather than hanging the suite.
func (c *cluster) crashed(t *testing.T, p *proc) {
	t.Helper()
	select {
	case <-p.p.Exited:
	case <-time.After(time.Minute):
		t.Fatalf("node %s did not exit at its fault point within a minute", p.name)
	}
	p.p, p.extraEnv = nil, nil
}

// kill9 kills a node as a crash would.
func (c *cluster) kill9(p *proc) {
	p.p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.p.Exited
	p.p = nil
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// teardown kills the sandboxes (a killed node is started again first, to
// clean up after itself), stops everything and checks nothing is left.
func (c *cluster) teardown(t testing.TB) {
	ctx := context.Background()
	for _, p := range c.nodes {
		if p.p == nil && p.logPath != "" {
			if err := c.start(p, "http://"+p.addr+"/health"); err != nil {
				t.Errorf("restarting %s: %v", p.name, err)
			}
		}
	}
	if c.api != nil && c.api.p != nil && c.st != nil {
		recs, _ := c.st.ListSandboxes(ctx, store.SandboxFilter{Teams: store.AllTeams(), States: []store.SandboxState{store.StateRunning, store.StatePaused}})
		for _, r := range recs {
			key := c.apiKey
			if r.TeamID != recs[0].TeamID && c.otherKey != "" {
				key = c.otherKey
			}
			c.call(ctx, key, "DELETE", "/sandboxes/"+r.ID, nil)
		}
	}
	for _, p := range append([]*proc{c.api}, c.nodes...) {
		if p != nil {
			c.stop(p)
		}
	}
	for _, n := range c.nodes {
		for _, m := range seckit.MountsBelow(n.dataDir) {
			t.Errorf("%s left a mount: %s", n.name, m)
			exec.Command("umount", "-l", m).Run()
		}
		if ns := seckit.NetnsWithPrefix(n.name); len(ns) > 0 {
			t.Errorf("%s left network namespaces: %v", n.name, ns)
		}
		for _, dev := range loopDevicesBelow([]string{n.dataDir}) {
			t.Errorf("%s left a loop device: %s", n.name, dev)
		}
		os.RemoveAll(n.dataDir)
	}
	if t.Failed() || testing.Verbose() {
		for _, p := range append([]*proc{c.api}, c.nodes...) {
			if p != nil && p.logPath != "" {
				t.Logf("%s log: %s", p.name, p.logPath)
			}
		}
	} else {
		for _, p := range append([]*proc{c.api}, c.nodes...) {
			if p != nil {
				os.Remove(p.logPath)
			}
		}
	}
	if c.st != nil {
		c.st.Close()
	}
}

type response struct {
	status int
	body   []byte
}

func (r response) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

func (c *cluster) call(ctx context.Context, key, method, path string, body any) (response, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.api.addr+path, rd)
	if err != nil {
		return response{}, err
	}
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return response{status: res.StatusCode, body: b}, nil
}

// setNode sets a node's state (cordoned: nothing placed there).
func (c *cluster) setNode(ctx context.Context, name string, st store.NodeState) error {
	verb := map[store.NodeState]string{store.NodeCordoned: "cordon", store.NodeReady: "uncordon"}[st]
	out, err := exec.CommandContext(ctx, c.warren, "nodes", verb, name, "--store", c.storeURL).CombinedOutput()
	if err != nil {
		return fmt.Errorf("warren nodes %s %s: %v: %s", verb, name, err, out)
	}
	return nil
}

type sandbox struct{ ID, EnvdToken string }

// createOn creates a base sandbox on node name (the other cordoned).
func (c *cluster) createOn(ctx context.Context, t testing.TB, name string) sandbox {
	t.Helper()
	for _, n := range c.nodes {
		if n.name != name {
			if err := c.setNode(ctx, n.name, store.NodeCordoned); err != nil {
				t.Fatal(err)
			}
			defer c.setNode(ctx, n.name, store.NodeReady)
		}
	}
	time.Sleep(time.Second) // the api rereads the nodes every half second
	r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
	if err != nil || r.status != http.StatusCreated {
		t.Fatalf("create: %v %v", r, err)
	}
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatal(err)
	}
	return sandbox{ID: out.SandboxID, EnvdToken: out.EnvdAccessToken}
}

type result struct {
	stdout string
	exit   int
}

// exec runs a shell script in the sandbox through the api's proxy.
func (c *cluster) exec(ctx context.Context, sb sandbox, script string) (result, error) {
	r, err := seckit.Exec(ctx, c.proxyURL(), sb.ID, sb.EnvdToken, script)
	return result{stdout: r.Stdout, exit: r.Exit}, err
}

// The counter a suite starts in a sandbox: a process whose state lives
// in its memory only, written out on SIGUSR1, so that a resume shows
// whether the memory was restored (it goes on from where it was) or the
// sandbox booted anew. startCounter waits until the trap is set (a
// signal before it would kill the shell) and prints the first count;
// readCounter prints the file, whether the counter is alive and its
// count now, each waited for (a loaded host runs the trap late), not
// slept for.
const (
	startCounter = `cat > /tmp/counter.sh <<'EOF2'
n=0
trap 'echo "$n" > /tmp/count' USR1
: > /tmp/counter.ready
while :; do n=$((n+1)); sleep 0.05; done
EOF2
rm -f /tmp/count /tmp/counter.ready
nohup sh /tmp/counter.sh >/dev/null 2>&1 &
echo $! > /tmp/counter.pid
for i in $(seq 400); do [ -e /tmp/counter.ready ] && break; sleep 0.05; done
sleep 0.2
` + signalCounter
	signalCounter = `rm -f /tmp/count; kill -USR1 $(cat /tmp/counter.pid)
for i in $(seq 400); do [ -s /tmp/count ] && break; sleep 0.05; done
cat /tmp/count`
)

// readCounter is the script that prints file's content, "alive" if the
// counter runs, and its count.
func readCounter(file string) string {
	return "cat " + file + "; kill -0 $(cat /tmp/counter.pid) && echo alive; " + signalCounter
}

// newTeam makes a team with an API key, which teardown uses for the
// team's sandboxes.
func (c *cluster) newTeam(ctx context.Context, t *testing.T, id string) string {
	t.Helper()
	if err := c.st.CreateTeam(ctx, store.Team{ID: id, Name: id, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	_, key, err := auth.CreateKey(ctx, c.st, id, store.KindAPIKey, "blob test", "")
	if err != nil {
		t.Fatal(err)
	}
	c.otherKey = key
	return key
}

// s3Client reaches the test's S3 server directly, as an operator would.
func (c *cluster) s3Client(t testing.TB) *minio.Client {
	t.Helper()
	mc, err := minio.New(c.s3.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(c.s3.AccessKey, c.s3.SecretKey, ""), BucketLookup: minio.BucketLookupPath, Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	return mc
}
