package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/envdinfo"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// The integration tests run real sandboxes: root, real namespaces and
// cgroups, the real envd. Shared fixtures (envd binary, busybox rootfs) are
// built once per test binary under fixtureDir.
var (
	fixtureDir string // removed by TestMain
	stateBase  string // per-process runtime state, removed by TestMain
)

// runscCache is where the tests build runsc once per machine (the same
// place `warren setup` installs it).
const runscCache = "/var/lib/warren/bin"

// testCgroupParent keeps test sandboxes apart from real ones.
const testCgroupParent = "/warren-test"

func TestMain(m *testing.M) {
	var err error
	fixtureDir, err = os.MkdirTemp("", "warren-runtime-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Short: runsc puts unix sockets under its root (108-byte limit).
	stateBase = fmt.Sprintf("/run/warren-test-%d", os.Getpid())
	code := m.Run()
	// runsc bind-mounts a shared empty netns for its gofers into its root.
	for unix.Unmount(filepath.Join(stateBase, "runsc/state/null-netns"), unix.MNT_DETACH) == nil {
	}
	os.RemoveAll(fixtureDir)
	os.RemoveAll(stateBase)
	// The tests' cgroup parent, once every sandbox's cgroup is gone.
	if m, err := readCgroupMounts(); err == nil {
		for _, h := range m.hierarchies() {
			os.Remove(filepath.Join(h, testCgroupParent))
		}
	}
	os.Exit(code)
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs real sandboxes (namespaces, cgroups, netns)")
	}
	if testing.Short() {
		t.Skip("runs real sandboxes: not in -short (make check)")
	}
}

// tlog adapts t.Logf to an io.Writer for progress output.
type tlog struct{ t testing.TB }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// onceFile makes a fixture file once per test binary, the first time a
// test asks for it, and fails every test that asks when making it failed.
func onceFile(build func() (string, error)) func(testing.TB) string {
	get := sync.OnceValues(build)
	return func(t testing.TB) string {
		t.Helper()
		path, err := get()
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
}

// buildEnvd builds the real envd, static.
var buildEnvd = onceFile(func() (string, error) { return testenv.BuildEnvd(fixtureDir) })

// busyboxRootfs builds a ~2 MB rootfs: static busybox with its applets,
// root and a `user` account. Used as the read-only lower layer.
var busyboxRootfs = onceFile(func() (string, error) { return makeBusyboxRootfs(filepath.Join(fixtureDir, "rootfs")) })

func makeBusyboxRootfs(dir string) (string, error) {
	bb, err := exec.LookPath("busybox")
	if err != nil || checkStatic(bb) != nil {
		cmd := exec.Command("apt-get", "install", "-y", "--no-install-recommends", "busybox-static")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get install busybox-static: %v\n%s", err, out)
		}
		bb = "/bin/busybox"
	}
	for _, d := range []string{"bin", "etc", "tmp", "root", "home/user", "proc", "sys", "dev", "opt/warren", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	os.Chmod(filepath.Join(dir, "tmp"), 0o1777)
	os.Chown(filepath.Join(dir, "home/user"), 1000, 1000)
	data, err := os.ReadFile(bb)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command("chroot", dir, "/bin/busybox", "--install", "-s", "/bin").CombinedOutput(); err != nil {
		return "", fmt.Errorf("busybox --install: %v\n%s", err, out)
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
		"etc/group":  "root:x:0:\nuser:x:1000:\n",
		"etc/hosts":  "127.0.0.1 localhost\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// overlay is a sandbox rootfs the way the image code makes it.
type overlay struct{ upper, merged string }

// newOverlay mounts an overlay over lower, with upper copied from
// copyUpper if given (a clone's rootfs), unmounted at cleanup.
func newOverlay(t testing.TB, lower, copyUpper string) overlay {
	t.Helper()
	d := t.TempDir()
	o := overlay{upper: filepath.Join(d, "upper"), merged: filepath.Join(d, "merged")}
	work := filepath.Join(d, "work")
	for _, p := range []string{work, o.merged} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if copyUpper != "" {
		if out, err := exec.Command("cp", "-a", copyUpper, o.upper).CombinedOutput(); err != nil {
			t.Fatalf("copy upper: %v\n%s", err, out)
		}
	} else if err := os.MkdirAll(o.upper, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, o.upper, work)
	if out, err := exec.Command("mount", "-t", "overlay", "overlay", "-o", opts, o.merged).CombinedOutput(); err != nil {
		t.Fatalf("mount overlay: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", o.merged).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v %s; detaching", o.merged, err, out)
			exec.Command("umount", "-l", o.merged).Run()
		}
	})
	return o
}

// testNet is a network namespace with a veth pair and a /30, as the
// network package prepares them.
type testNet struct {
	name, path, hostVeth string
	hostIP, sandboxIP    string
}

var netSeq struct {
	sync.Mutex
	n int
}

// newNetNS creates a netns named after this process, with a veth pair:
// host side <hostIP>/30, sandbox side eth0 <sandboxIP>/30 with a default
// route. Addresses come from 10.251.0.0/16, spread by PID so that
// concurrent test processes don't collide. Removed at cleanup.
func newNetNS(t testing.TB) *testNet {
	t.Helper()
	netSeq.Lock()
	netSeq.n++
	n := netSeq.n
	netSeq.Unlock()
	if n >= 64 {
		t.Fatal("too many test netns")
	}
	pid := os.Getpid()
	net := &testNet{name: fmt.Sprintf("wrt%d-%d", pid%100000, n)}
	net.path = "/var/run/netns/" + net.name
	net.hostVeth = fmt.Sprintf("wv%d-%d", pid%100000, n)
	third := (pid / 7) % 250
	net.hostIP = fmt.Sprintf("10.251.%d.%d", third, 4*n+1)
	net.sandboxIP = fmt.Sprintf("10.251.%d.%d", third, 4*n+2)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", net.name).Run()
		exec.Command("ip", "link", "del", net.hostVeth).Run()
	})
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", net.name)
	run("link", "add", net.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", net.name)
	run("addr", "add", net.hostIP+"/30", "dev", net.hostVeth)
	run("link", "set", net.hostVeth, "up")
	run("-n", net.name, "link", "set", "lo", "up")
	run("-n", net.name, "link", "set", "eth0", "up")
	net.readdIP(t)
	return net
}

// readdIP puts the sandbox address and default route back on eth0: runsc
// moves them into its own network stack, so a netns that served a gVisor
// sandbox has none left, and a restore into it needs them back.
func (n *testNet) readdIP(t testing.TB) {
	t.Helper()
	exec.Command("ip", "-n", n.name, "addr", "flush", "dev", "eth0").Run()
	for _, args := range [][]string{
		{"-n", n.name, "addr", "add", n.sandboxIP + "/30", "dev", "eth0"},
		{"-n", n.name, "route", "add", "default", "via", n.hostIP},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// envdURL is envd's base URL in a sandbox.
func envdURL(ip string) string { return "http://" + net.JoinHostPort(ip, strconv.Itoa(envdinfo.Port)) }

// healthy asks envd's /health once.
func healthy(ip string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", envdURL(ip)+"/health", nil)
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("health: %s", resp.Status)
	}
	return nil
}

// waitHealthy polls /health until it answers 204, for at most limit.
func waitHealthy(t testing.TB, ip string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	if poll.Within(limit, 5*time.Millisecond, func() bool { err = healthy(ip, 500*time.Millisecond); return err == nil }) {
		return time.Since(start)
	}
	t.Fatalf("envd at %s not healthy after %v: %v", ip, limit, err)
	return 0
}

// sandboxExec runs a command inside a sandbox with the runtime's own exec
// (test-only: the platform talks to envd instead).
func sandboxExec(rt Runtime, id string, args ...string) (string, error) {
	var cmd []string
	var bin string
	switch r := rt.(type) {
	case *Runc:
		bin, cmd = r.cfg.Binary, []string{"--root", r.rootDir(), "exec", id}
	case *Runsc:
		bin, cmd = r.cfg.Binary, append(r.flags(), "exec", rid(id))
	default:
		return "", errors.New("unknown runtime")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append(cmd, args...)...).CombinedOutput()
	return string(out), err
}

// newTestRuntime returns a backend with its state under stateBase, or
// skips when it cannot run here.
func newTestRuntime(t testing.TB, name string) Runtime {
	t.Helper()
	requireRoot(t)
	cfg := Config{StateDir: filepath.Join(stateBase, name), CgroupParent: testCgroupParent}
	switch name {
	case "runc":
		if _, err := EnsureRunc(context.Background(), tlog{t}); err != nil {
			t.Fatalf("EnsureRunc: %v", err)
		}
	case "runsc":
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		bin, err := EnsureRunsc(ctx, runscCache, tlog{t})
		if err != nil {
			t.Fatalf("EnsureRunsc: %v", err)
		}
		cfg.Binary = bin
	}
	rt, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// testSandbox is a started sandbox and what it runs on.
type testSandbox struct {
	spec Spec
	net  *testNet
	fs   overlay
}

// newSpec prepares rootfs and netns for a sandbox with the given ID.
func newSpec(t testing.TB, id string) testSandbox {
	t.Helper()
	net := newNetNS(t)
	fs := newOverlay(t, busyboxRootfs(t), "")
	return testSandbox{
		net: net,
		fs:  fs,
		spec: Spec{
			ID:          id,
			RootFS:      fs.merged,
			EnvdPath:    buildEnvd(t),
			NetNSPath:   net.path,
			Hostname:    "sb-" + id,
			AccessToken: "secret-token",
			CPUCount:    1,
			MemoryMB:    128,
		},
	}
}

// baseOf returns the part of a backend both share (paths, cgroups).
func baseOf(rt Runtime) *base {
	switch r := rt.(type) {
	case *Runc:
		return r.base
	case *Runsc:
		return r.base
	}
	panic(fmt.Sprintf("baseOf: %T is no backend", rt))
}

// assertGone checks that nothing of sandbox id is left: runtime state,
// sandbox directory, cgroups, processes.
func assertGone(t testing.TB, rt Runtime, id string, pid int) {
	t.Helper()
	ctx := context.Background()
	if _, err := rt.State(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Errorf("State after Delete: %v, want ErrNotFound", err)
	}
	b := baseOf(rt)
	if left := cgroupLeftovers(b.cgroups, b.cgroupPath(id)); len(left) > 0 {
		t.Errorf("cgroups left after Delete: %v", left)
	}
	if _, err := os.Stat(b.sandboxDir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox dir left after Delete: %v", err)
	}
	if entries, _ := os.ReadDir(b.rootDir()); len(entries) > 0 {
		for _, e := range entries {
			if e.Name() == id || strings.HasPrefix(e.Name(), id+"_sandbox:") || strings.HasPrefix(e.Name(), rid(id)+"_sandbox:") {
				t.Errorf("runtime state left after Delete: %s", e.Name())
			}
		}
	}
	if pid > 0 && processAlive(pid) {
		t.Errorf("process %d still alive after Delete", pid)
	}
}
