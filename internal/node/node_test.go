package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/testenv"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// The node tests run real sandboxes from the real base template: root, the
// runtimes `warren setup` installs, and the base built in Warren's own data
// directory (reused between runs; built once on a new machine).

var (
	fixtureOnce sync.Once
	fixture     struct {
		store *image.Store
		roots *rootfs.Manager
		base  *image.Template
		envd  string
		err   error
	}
)

func setupFixture(t testing.TB) {
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
		f := &fixture
		if f.err = setup.Run(ctx, setup.Options{}, testWriter{t}); f.err != nil {
			return
		}
		if f.store, f.err = image.Open(setup.DefaultDataDir); f.err != nil {
			return
		}
		if f.roots, f.err = rootfs.Open(setup.DefaultDataDir); f.err != nil {
			return
		}
		if f.base, f.err = f.store.Template(baseimage.TemplateID); f.err != nil {
			return
		}
		dir, err := os.MkdirTemp("", "warren-node-test-envd-")
		if err != nil {
			f.err = err
			return
		}
		f.envd, f.err = testenv.BuildEnvd(dir)
	})
	if fixture.err != nil {
		t.Fatal(fixture.err)
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testNode is a Node with its own network prefix, range and runtime state
// dir, so it never meets a running Warren.
func testNode(t testing.TB, runtimeName string) *Node {
	t.Helper()
	prefix := "wnt" + runtimeName[3:4] // wnts, wntc
	cidr := map[string]string{"runsc": "10.124.0.0/20", "runc": "10.124.16.0/20"}[runtimeName]
	return newTestNode(t, runtimeName, network.Config{CIDR: netip.MustParsePrefix(cidr), Prefix: prefix, PoolSize: 2}, "/etc/resolv.conf")
}

// newTestNode is testNode with a network configuration and resolv.conf of
// the caller's.
func newTestNode(t testing.TB, runtimeName string, nwCfg network.Config, resolvConf string) *Node {
	t.Helper()
	setupFixture(t)
	cfg := runtime.Config{StateDir: filepath.Join("/run/warren-node-test", runtimeName), CgroupParent: "/warren-node-test"}
	if runtimeName == "runsc" {
		cfg.Binary = setup.RunscPath(setup.DefaultDataDir)
	}
	rt, err := runtime.New(runtimeName, cfg)
	if err != nil {
		t.Fatal(err)
	}
	nw, err := network.New(nwCfg)
	if err != nil {
		t.Fatal(err)
	}
	sweepEarlierRun(t, rt, nw, nwCfg.Prefix)
	n, err := New(Config{Runtime: rt, Network: nw, Rootfs: LocalRootfs(fixture.roots, fixture.store), EnvdPath: fixture.envd, ResolvConf: resolvConf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nw.Destroy(); err != nil {
			t.Errorf("network Destroy: %v", err)
		}
	})
	return n
}

// sweepEarlierRun removes, before this process first uses a runtime state
// dir or a network prefix, what an earlier test run that was killed left
// under it (containers, namespaces, veths): those are not this run's
// leaks, which TestNothingLeft reports.
func sweepEarlierRun(t testing.TB, rt runtime.Runtime, nw *network.Manager, prefix string) {
	testenv.SweepOnce(t, "runtime "+rt.Name(), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		containers, err := rt.List(ctx)
		if err != nil {
			return err
		}
		for _, c := range containers {
			t.Logf("removing container %s of an earlier run", c.ID)
			if err := rt.Delete(ctx, c.ID); err != nil {
				return err
			}
		}
		return nil
	})
	testenv.SweepOnce(t, "prefix "+prefix, func() error { return nw.Cleanup(nil) })
}

func baseRequest(t testing.TB, id string) CreateRequest {
	layers, err := fixture.store.LayerDirs(fixture.base)
	if err != nil {
		t.Fatal(err)
	}
	return CreateRequest{ID: id, Layers: layers, CPUCount: 1, MemoryMB: 256, DiskSizeMB: 256, AccessToken: "tok-" + id, User: "user"}
}

func create(t testing.TB, n *Node, req CreateRequest) *Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := n.Create(ctx, req)
	if err != nil {
		t.Fatalf("Create %s: %v", req.ID, err)
	}
	t.Cleanup(func() {
		if err := n.Delete(context.Background(), inst); err != nil {
			t.Errorf("Delete %s: %v", inst.ID, err)
		}
	})
	return inst
}

// sh runs a command in the sandbox through envd and returns its output and
// exit code.
func sh(t testing.TB, inst *Instance, token, user, script string, timeout time.Duration) (string, int) {
	t.Helper()
	c := processconnect.NewProcessClient(freshConns, inst.EnvdURL(), connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}})
	req.Header().Set("X-Access-Token", token)
	if user != "" {
		req.Header().Set("Authorization", "Basic "+basic(user))
	}
	stream, err := c.Start(ctx, req)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer stream.Close()
	var out strings.Builder
	code := -100
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out.Write(ev.GetData().GetStdout())
		out.Write(ev.GetData().GetStderr())
		if end := ev.GetEnd(); end != nil {
			code = int(end.ExitCode)
		}
	}
	if err := stream.Err(); err != nil {
		return out.String() + "\n[stream: " + err.Error() + "]", code
	}
	return out.String(), code
}

// freshConns never reuses a connection: sandbox addresses are reused by
// later sandboxes, and a kept-alive connection to an earlier sandbox at
// the same address would be reset by the new one.
var freshConns = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func basic(user string) string {
	return map[string]string{"root": "cm9vdDo=", "user": "dXNlcjo="}[user]
}

func TestSandboxBasicsAndIsolation(t *testing.T) {
	for _, rtName := range []string{"runsc", "runc"} {
		t.Run(rtName, func(t *testing.T) {
			n := testNode(t, rtName)
			a := create(t, n, baseRequest(t, "iso-a-"+rtName))
			b := create(t, n, baseRequest(t, "iso-b-"+rtName))
			tokA := "tok-" + a.ID

			// envd requires the token it was started with.
			res, err := freshConns.Post(a.EnvdURL()+"/process.Process/List", "application/json", strings.NewReader("{}"))
			if err != nil || res.StatusCode != 401 {
				t.Errorf("request without token: %v %v", res.Status, err)
			}
			if res != nil {
				res.Body.Close()
			}

			out, code := sh(t, a, tokA, "", "whoami; pwd; python3 -c 'print(6*7)'; node -e 'console.log(1+1)'; sudo -n true && echo sudo-ok", 30*time.Second)
			if code != 0 || out != "user\n/home/user\n42\n2\nsudo-ok\n" {
				t.Errorf("basics: code %d out %q", code, out)
			}
			// A setuid program the sandbox made lives on its disk, which
			// the host mounts nosuid: the sandbox's own view must still
			// honour it.
			out, code = sh(t, a, tokA, "", "sudo install -m 4755 /usr/bin/sudo /usr/local/bin/sudo2 && /usr/local/bin/sudo2 -n id -u", 30*time.Second)
			if code != 0 || out != "0\n" {
				t.Errorf("setuid program in the writable layer: code %d out %q", code, out)
			}

			// Host processes are invisible: the sandbox sees only its own.
			out, _ = sh(t, a, tokA, "root", "ps -e -o comm= | sort -u | tr '\\n' ' '", 10*time.Second)
			if strings.Contains(out, "node.test") || strings.Contains(out, "process_api") || strings.Contains(out, "go") && strings.Contains(out, "test") {
				t.Errorf("host processes visible: %s", out)
			}

			// Host services are unreachable, on loopback and on the host's addresses.
			ln, err := net.Listen("tcp", "0.0.0.0:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost\n"))
					c.Close()
				}
			}()
			port := ln.Addr().(*net.TCPAddr).Port
			targets := []string{"127.0.0.1", a.Slot.HostIP.String()}
			targets = append(targets, hostAddrs(t)...)
			for _, ip := range targets {
				out, code := sh(t, a, tokA, "", fmt.Sprintf("curl -s -m 1 http://%s:%d/", ip, port), 15*time.Second)
				if code == 0 || strings.Contains(out, "host") {
					t.Errorf("sandbox reached a host service at %s:%d: %q", ip, port, out)
				}
			}
			// Other sandboxes are unreachable.
			out, code = sh(t, a, tokA, "", fmt.Sprintf("curl -s -m 1 http://%s:%d/health -o /dev/null -w '%%{http_code}'", b.Slot.SandboxIP, envdinfo.Port), 15*time.Second)
			if code == 0 {
				t.Errorf("sandbox a reached sandbox b's envd: %q", out)
			}

			// Disk fill stops at diskSizeMB (256).
			out, code = sh(t, a, tokA, "", "dd if=/dev/zero of=/home/user/fill bs=1M count=400 2>&1 | grep -o 'No space left on device'; stat -c %s /home/user/fill", 60*time.Second)
			if size, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(out, "No space left on device\n"))); !strings.HasPrefix(out, "No space left on device\n") || size > 256<<20 {
				t.Errorf("disk fill: code %d out %q", code, out)
			}

			// Pause and resume.
			ctx := context.Background()
			if err := n.Freeze(ctx, a); err != nil {
				t.Fatal(err)
			}
			c := http.Client{Timeout: 300 * time.Millisecond, Transport: freshConns.Transport}
			if res, err := c.Get(a.EnvdURL() + "/health"); err == nil {
				res.Body.Close()
				t.Error("paused sandbox answered /health")
			}
			if err := n.Thaw(ctx, a); err != nil {
				t.Fatal(err)
			}
			if out, code := sh(t, a, tokA, "", "echo back", 10*time.Second); code != 0 || out != "back\n" {
				t.Errorf("after resume: %d %q", code, out)
			}
		})
	}
}

func TestLimits(t *testing.T) {
	for _, rtName := range []string{"runc", "runsc"} {
		t.Run(rtName, func(t *testing.T) {
			n := testNode(t, rtName)
			req := baseRequest(t, "lim-"+rtName)
			req.MemoryMB = 192
			inst := create(t, n, req)
			other := create(t, n, baseRequest(t, "lim-other-"+rtName))
			tok := "tok-" + inst.ID

			out, code := sh(t, inst, tok, "", "python3 -c 'b = bytearray(512 << 20); print(len(b))'", 60*time.Second)
			if code == 0 {
				t.Errorf("a 512 MiB allocation succeeded under a 192 MiB limit: %q", out)
			}
			// The host and other sandboxes carry on.
			if out, code := sh(t, other, "tok-"+other.ID, "", "echo alive", 10*time.Second); code != 0 || out != "alive\n" {
				t.Errorf("other sandbox after the OOM: %d %q", code, out)
			}
			if rtName == "runc" {
				// Under runc the kernel OOM killer picks the hog inside the
				// sandbox's cgroup; envd survives.
				if out, code := sh(t, inst, tok, "", "echo envd-alive", 10*time.Second); code != 0 || out != "envd-alive\n" {
					t.Errorf("envd after the OOM kill: %d %q", code, out)
				}
				// A fork bomb is stopped by the pids limit (1024): the cgroup
				// never holds more tasks than that, and nothing outside the
				// sandbox notices. (envd itself may die when the limit leaves
				// it no room for a thread; see docs/operating.md, Known limits.)
				bomb := `nohup python3 -c '
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(20)
            os._exit(0)
    except OSError:
        time.sleep(0.01)
' >/dev/null 2>&1 &
echo started`
				sh(t, inst, tok, "", bomb, 10*time.Second)
				var peak uint64
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
					if s, err := n.Stats(context.Background(), inst); err == nil && s.Pids > peak {
						peak = s.Pids
					}
				}
				if peak < 200 || peak > 1024 {
					t.Errorf("fork bomb: peak tasks %d, want a running bomb held at or below the 1024 limit", peak)
				}
				if out, code := sh(t, other, "tok-"+other.ID, "", "echo alive", 10*time.Second); code != 0 || out != "alive\n" {
					t.Errorf("other sandbox during the fork bomb: %d %q", code, out)
				}
			}
		})
	}
}

// hostAddrs returns the host's IPv4 addresses outside the test ranges.
func hostAddrs(t testing.TB) []string {
	ifaces, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range ifaces {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil || ipn.IP.IsLoopback() || strings.HasPrefix(ipn.IP.String(), "10.12") {
			continue
		}
		out = append(out, ipn.IP.String())
	}
	return out
}

func TestCheckpointRestoreKeepsProcessMemory(t *testing.T) {
	n := testNode(t, "runsc")
	req := baseRequest(t, "ckpt-src")
	src := create(t, n, req)
	tok := "tok-" + src.ID
	// A counter that lives only in a process's memory, served on :8000.
	script := `nohup python3 -c '
import http.server, itertools
c = itertools.count(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(str(next(c)).encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()' >/dev/null 2>&1 &
for i in $(seq 50); do curl -s localhost:8000/ >/dev/null && break; sleep 0.1; done
curl -s localhost:8000/; curl -s localhost:8000/`
	out, code := sh(t, src, tok, "", script, 30*time.Second)
	if code != 0 || !strings.HasSuffix(out, "23") {
		t.Fatalf("counter server: %d %q", code, out)
	}
	img := t.TempDir()
	ctx := context.Background()
	if err := n.Checkpoint(ctx, src, img, true); err != nil {
		t.Fatal(err)
	}
	cloneReq := req
	cloneReq.ID = "ckpt-clone"
	clone, err := n.Restore(ctx, cloneReq, img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Delete(context.Background(), clone) })
	if clone.Slot.SandboxIP == src.Slot.SandboxIP {
		t.Fatal("clone shares the source's address")
	}
	get := func(inst *Instance) string {
		c := http.Client{Timeout: 5 * time.Second, Transport: freshConns.Transport}
		res, err := c.Get("http://" + net.JoinHostPort(inst.Slot.SandboxIP.String(), "8000") + "/")
		if err != nil {
			return "error: " + err.Error()
		}
		defer res.Body.Close()
		b := make([]byte, 32)
		k, _ := res.Body.Read(b)
		return string(b[:k])
	}
	// Both continue from 4: the clone restored the counter's memory, and
	// from then on the two count independently.
	if got := get(clone); got != "4" {
		t.Errorf("clone counter = %q, want 4", got)
	}
	if got := get(src); got != "4" {
		t.Errorf("source counter = %q, want 4", got)
	}
	if got := get(clone); got != "5" {
		t.Errorf("clone counter = %q, want 5", got)
	}
}

func TestCleanupRemovesUnknownSandboxes(t *testing.T) {
	n := testNode(t, "runc")
	ctx := context.Background()
	keep := create(t, n, baseRequest(t, "clean-keep"))
	// A sandbox of a "crashed run": running, but not known to the caller.
	lost, err := n.Create(ctx, baseRequest(t, "clean-lost"))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Cleanup(ctx, map[string]string{keep.ID: keep.Slot.Name}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Runtime().State(ctx, lost.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("lost sandbox still known to the runtime: %v", err)
	}
	if _, err := os.Stat(lost.Slot.NetNSPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lost sandbox's netns survived: %v", err)
	}
	if _, err := os.Stat(lost.Rootfs.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lost sandbox's rootfs survived: %v", err)
	}
	if out, code := sh(t, keep, "tok-"+keep.ID, "", "echo kept", 10*time.Second); code != 0 || out != "kept\n" {
		t.Errorf("kept sandbox after Cleanup: %d %q", code, out)
	}
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	n := testNode(t, "runc")
	broken := *n
	broken.cfg.EnvdPath = "/nonexistent/envd" // the runtime cannot start it
	req := baseRequest(t, "fail-create")
	if inst, err := broken.Create(context.Background(), req); err == nil {
		n.Delete(context.Background(), inst)
		t.Fatal("Create with a missing envd succeeded")
	}
	if _, err := n.Runtime().State(context.Background(), req.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("runtime still knows the failed sandbox: %v", err)
	}
	if _, err := os.Stat(filepath.Join(fixture.store.Dir(), "sandboxes", req.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("root filesystem of the failed sandbox left: %v", err)
	}
	if entries, _ := os.ReadDir("/run/netns"); len(entries) > 0 {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "wntc-") && !n.cfg.Network.IsPooled(e.Name()) {
				t.Errorf("netns %s left by the failed create", e.Name())
			}
		}
	}
}

// TestCanceledCreateLeavesNothing: a create whose caller gives up while
// runsc is starting the sandbox (a client hanging up, a server stopping)
// must not leave the sandbox's processes behind; TestNothingLeft checks.
func TestCanceledCreateLeavesNothing(t *testing.T) {
	n := testNode(t, "runsc")
	// Cancel at several points of the start: the runtime's own create,
	// its start, and the wait for envd.
	for i, after := range []time.Duration{20, 50, 80, 110, 140, 170, 200} {
		req := baseRequest(t, fmt.Sprintf("fail-cancel%d", i))
		ctx, cancel := context.WithTimeout(context.Background(), after*time.Millisecond)
		inst, err := n.Create(ctx, req)
		cancel()
		if err == nil {
			n.Delete(context.Background(), inst) // finished in time: nothing to undo
			continue
		}
		if _, err := n.Runtime().State(context.Background(), req.ID); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("cancelled after %v ms: the runtime still knows the sandbox: %v", int(after), err)
		}
	}
}

// TestTemplateLinksNeverReachTheHost: a template may make the files the
// node writes or mounts over (/etc/hosts, /etc/resolv.conf, envd's mount
// point) or their directory links to host paths. Create must succeed,
// give the sandbox its own /etc/hosts in its writable layer, and leave
// the host's files as they were.
func TestTemplateLinksNeverReachTheHost(t *testing.T) {
	for _, rtName := range []string{"runsc", "runc"} {
		t.Run(rtName, func(t *testing.T) {
			n := testNode(t, rtName)
			base, err := fixture.store.LayerDirs(fixture.base)
			if err != nil {
				t.Fatal(err)
			}
			// Each plants links to victim (in victimDir) in a layer on
			// top of the base.
			var victimDir, victim string
			cases := map[string]func(layer string) error{
				"hosts symlink": func(l string) error {
					return os.Symlink(victim, filepath.Join(l, "etc", "hosts"))
				},
				"hosts hard link": func(l string) error {
					return os.Link(victim, filepath.Join(l, "etc", "hosts"))
				},
				"resolv.conf and envd symlinks": func(l string) error {
					if err := os.MkdirAll(filepath.Join(l, "opt", "warren"), 0o755); err != nil {
						return err
					}
					if err := os.Symlink(victim, filepath.Join(l, "opt", "warren", "envd")); err != nil {
						return err
					}
					return os.Symlink(victim, filepath.Join(l, "etc", "resolv.conf"))
				},
				// /etc is a link to victimDir, which exists in the root
				// too (a copy of the base's /etc): the host's victimDir
				// must get no hosts file.
				"etc symlink": func(l string) error {
					if err := os.Remove(filepath.Join(l, "etc")); err != nil {
						return err
					}
					inRoot := filepath.Join(l, victimDir)
					if err := os.MkdirAll(filepath.Dir(inRoot), 0o755); err != nil {
						return err
					}
					if out, err := exec.Command("cp", "-a", filepath.Join(base[0], "etc"), inRoot).CombinedOutput(); err != nil {
						return fmt.Errorf("cp: %v: %s", err, out)
					}
					return os.Symlink(victimDir, filepath.Join(l, "etc"))
				},
			}
			i := 0
			for name, plant := range cases {
				i++
				t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
					victimDir = t.TempDir()
					victim = filepath.Join(victimDir, "passwd")
					if err := os.WriteFile(victim, []byte("host file\n"), 0o644); err != nil {
						t.Fatal(err)
					}
					layer := t.TempDir()
					if err := os.Mkdir(filepath.Join(layer, "etc"), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := plant(layer); err != nil {
						t.Fatal(err)
					}
					req := baseRequest(t, fmt.Sprintf("link%d-%s", i, rtName))
					req.Layers = append(append([]string(nil), req.Layers...), layer)
					inst := create(t, n, req)
					if b, err := os.ReadFile(victim); err != nil || string(b) != "host file\n" {
						t.Errorf("host file changed: %q %v", b, err)
					}
					if es, _ := os.ReadDir(victimDir); len(es) != 1 {
						t.Errorf("host dir %s has %d entries, want only passwd", victimDir, len(es))
					}
					out, code := sh(t, inst, "tok-"+inst.ID, "root", "cat /etc/hosts; test -L /etc/hosts && echo LINK; stat -c %h /etc/hosts", 10*time.Second)
					if code != 0 || !strings.Contains(out, "127.0.1.1\t"+inst.ID+"\n") || strings.Contains(out, "LINK") || !strings.HasSuffix(out, "\n1\n") {
						t.Errorf("the sandbox's /etc/hosts: code %d out %q", code, out)
					}
					upper := inst.Rootfs.(interface{ UpperDir() string }).UpperDir()
					etc := filepath.Join(upper, "etc")
					if name == "etc symlink" {
						etc = filepath.Join(upper, victimDir)
					}
					if fi, err := os.Lstat(filepath.Join(etc, "hosts")); err != nil || !fi.Mode().IsRegular() {
						t.Errorf("hosts in the writable layer: %v %v, want a regular file", fi, err)
					}
				})
			}
		})
	}
}

// TestEnvdLogBoundedByDisk: root in a sandbox can reopen envd's stdout
// (/proc/1/fd/1) and write to it without end. The file is on the
// sandbox's own disk, so it stops at the disk limit, and nothing lands
// on the host's file systems (the runtime's state dir is a tmpfs in
// production: host memory).
func TestEnvdLogBoundedByDisk(t *testing.T) {
	for _, rtName := range []string{"runsc", "runc"} {
		t.Run(rtName, func(t *testing.T) {
			n := testNode(t, rtName)
			req := baseRequest(t, "logfill-"+rtName)
			req.DiskSizeMB = 64
			inst := create(t, n, req)
			tok := "tok-" + inst.ID
			out, code := sh(t, inst, tok, "root", "dd if=/dev/zero of=/proc/1/fd/1 bs=1M count=192 2>&1", 60*time.Second)
			t.Logf("dd: code %d: %s", code, out)
			if !strings.Contains(out, "No space left on device") {
				t.Errorf("writing 192 MB into envd's log under a 64 MB disk: no ENOSPC: %q", out)
			}
			if fi, err := os.Stat(n.Runtime().LogPath(inst.ID)); err == nil && fi.Size() > 1<<20 {
				t.Errorf("the runtime's state dir holds a %d-byte envd log", fi.Size())
			}
			fi, err := os.Stat(inst.LogPath)
			if err != nil {
				t.Fatalf("envd's log: %v", err)
			}
			if fi.Size() > 64<<20 {
				t.Errorf("envd's log is %d bytes, past the 64 MB disk", fi.Size())
			}
			var logFS, diskFS unix.Statfs_t
			if unix.Statfs(inst.LogPath, &logFS) != nil || unix.Statfs(filepath.Dir(inst.Rootfs.(interface{ UpperDir() string }).UpperDir()), &diskFS) != nil || logFS.Fsid != diskFS.Fsid {
				t.Errorf("envd's log %s is not on the sandbox's disk", inst.LogPath)
			}
			// The sandbox and its envd carry on.
			if out, code := sh(t, inst, tok, "", "echo alive", 10*time.Second); code != 0 || out != "alive\n" {
				t.Errorf("after filling the log: %d %q", code, out)
			}
		})
	}
}

// TestNothingLeft runs last (Go runs tests in source order) and lists what
// the node tests could have leaked.
func TestNothingLeft(t *testing.T) {
	setupFixture(t)
	var leaks []string
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "wnt") {
				leaks = append(leaks, "netns "+e.Name())
			}
		}
	}
	ifaces, _ := net.Interfaces()
	for _, i := range ifaces {
		if strings.HasPrefix(i.Name, "wnt") {
			leaks = append(leaks, "link "+i.Name)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, "/sandboxes/iso-") || strings.Contains(line, "/sandboxes/lim-") || strings.Contains(line, "/sandboxes/ckpt-") || strings.Contains(line, "/sandboxes/clean-") || strings.Contains(line, "/sandboxes/fail-") || strings.Contains(line, "/sandboxes/link") || strings.Contains(line, "/sandboxes/logfill-") || strings.Contains(line, "/sandboxes/egr-") || strings.Contains(line, "/sandboxes/lc-") {
			leaks = append(leaks, "mount "+line)
		}
	}
	for _, ctrl := range []string{"memory", "pids", "cpu", "freezer"} {
		if entries, err := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctrl, "warren-node-test")); err == nil && len(entries) > 0 {
			for _, e := range entries {
				if e.IsDir() {
					leaks = append(leaks, "cgroup "+ctrl+"/warren-node-test/"+e.Name())
				}
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), "/run/warren-node-test") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			leaks = append(leaks, fmt.Sprintf("process %d %q", pid, strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	if len(leaks) > 0 {
		t.Errorf("left behind:\n%s", strings.Join(leaks, "\n"))
	}
}
