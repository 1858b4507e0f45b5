package security

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/test/security/internal/seckit"
	"golang.org/x/sys/unix"
)

// The suite's own names and ranges: nothing else on the machine uses them.
const (
	netPrefix    = "wsec"
	netCIDR      = "10.127.0.0/16"
	runDir       = "/run/warren-sec"
	cgroupParent = "/warren-sec"
	// The runc case's server has names of its own, and a range apart from
	// the suite server's (a server refuses a range overlapping a live one's).
	runcPrefix, runcCIDR, runcRunDir, runcCgroupParent = "wsecr", "10.128.255.0/24", "/run/warren-sec-runc", "/warren-sec-runc"
	// installed is where `warren setup` put runsc and the base template.
	installed = seckit.Installed
	// dataFSMB is the size of the loop-mounted file system of the data
	// dir: room for a few builds, small enough to fill cheaply.
	dataFSMB = 10240
	// buildDiskMB is what the suite asks each build sandbox's disk to be
	// (--build-disk-mb), when the server has the flag.
	buildDiskMB = 512
	// maxUploadMB is --max-upload-mb, when the server has the flag.
	maxUploadMB = 16
	// pausedRetention is --paused-retention, when the server has the flag.
	pausedRetention = 8 * time.Second
	// tlsHost is the loopback address of the HTTPS proxy.
	tlsHost = "127.0.0.8"
	// volumeQuotaMB and maxVolumesPerTeam are --volume-quota and
	// --max-volumes-per-team, when the server has the flags.
	volumeQuotaMB, maxVolumesPerTeam = 64, 6
)

// S is the suite's server and what the tests share. TestMain sets it up.
var S *suite

type suite struct {
	repo, warren, envd string
	// hostDir holds the host files that attacks aim at; canaries records
	// their contents, checked after every case.
	hostDir  string
	canaries *canaries
	// resolvConf is the file given to --resolv-conf: the test resolver.
	resolvConf string
	hosts      *testHosts
	// hostService is a listener on all of the host's addresses that
	// sandboxes must not reach.
	hostService *hostListener
	// allowedRegistry is a loopback port given to --allow-insecure-registry:
	// the registry case serves its control registry there.
	allowedRegistry int

	srv *server
	// teamA is the default team (the server's first key); teamB and
	// teamC are made through the store.
	teamA, teamB, teamC team
	witness             *sandbox
}

type team struct {
	id, key string
}

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) (code int) {
	if os.Geteuid() != 0 {
		fmt.Println("test/security: skipped: the adversarial suite runs real sandboxes and needs root")
		return 0
	}
	flag.Parse() // testing.Short reads the flags, which m.Run would parse later
	if testing.Short() {
		fmt.Println("test/security: skipped by -short (make check): the adversarial suite runs real sandboxes")
		return 0
	}
	start := time.Now()
	s, err := newSuite()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/security:", err)
		if s != nil {
			s.teardown()
		}
		return 1
	}
	S = s
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintln(os.Stderr, "test/security: panic:", r)
			code = 1
		}
		if err := s.teardown(); err != nil {
			fmt.Fprintln(os.Stderr, "test/security: after the suite:", err)
			code = 1
		}
		if code != 0 || testing.Verbose() {
			fmt.Fprintf(os.Stderr, "test/security: server log: %s\n", s.srv.logPath)
		} else {
			os.Remove(s.srv.logPath)
		}
		fmt.Printf("test/security: the suite took %s\n", time.Since(start).Round(time.Second))
	}()
	return m.Run()
}

func newSuite() (*suite, error) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		return nil, err
	}
	s := &suite{repo: repo, warren: filepath.Join(repo, "bin", "warren"), envd: filepath.Join(repo, "bin", "envd")}
	for _, p := range []string{s.warren, s.envd} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s is missing: run `make build` first", p)
		}
	}
	for _, p := range []string{"bin/runsc", "layers", "templates/base.json"} {
		if _, err := os.Stat(filepath.Join(installed, p)); err != nil {
			return nil, fmt.Errorf("%s/%s is missing: run `make setup` first", installed, p)
		}
	}
	if s.hostDir, err = os.MkdirTemp("/var/tmp", "warren-sec-host-"); err != nil {
		return nil, err
	}
	s.canaries = &canaries{files: map[string][]byte{}}
	if s.hosts, err = newTestHosts(); err != nil {
		return s, err
	}
	s.resolvConf = filepath.Join(s.hostDir, "resolv.conf")
	if err := os.WriteFile(s.resolvConf, []byte("nameserver "+dnsHostAddr+"\n"), 0o644); err != nil {
		return s, err
	}
	if s.hostService, err = listenHostService(); err != nil {
		return s, err
	}
	if s.allowedRegistry, err = freePort(); err != nil {
		return s, err
	}
	dataDir, err := newDataDir(dataFSMB)
	if err != nil {
		return s, err
	}
	s.srv = &server{dataDir: dataDir, ownsFS: true}
	if err := s.srv.start(s, nil); err != nil {
		return s, err
	}
	if s.teamA, err = s.srv.defaultTeam(); err != nil {
		return s, err
	}
	if s.teamB, err = s.srv.newTeam("sec-team-b"); err != nil {
		return s, err
	}
	if s.teamC, err = s.srv.newTeam("sec-team-c"); err != nil {
		return s, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s.witness, err = s.createSandbox(ctx, s.teamA, createOpts{Timeout: 3600}); err != nil {
		return s, fmt.Errorf("creating the witness sandbox: %w", err)
	}
	return s, nil
}

// teardown kills every sandbox, stops the server and checks that nothing
// of it is left; then removes the test hosts and the data dir.
func (s *suite) teardown() error {
	var errs []error
	if s.srv != nil && s.srv.proc != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		for _, tm := range []team{s.teamA, s.teamB, s.teamC} {
			if tm.key != "" {
				errs = append(errs, s.srv.killAll(ctx, tm))
			}
		}
		cancel()
		errs = append(errs, s.srv.stop())
		errs = append(errs, s.srv.leftovers())
		errs = append(errs, s.srv.removeRules())
	}
	if s.srv != nil {
		errs = append(errs, s.srv.removeDataDir())
	}
	if s.hostService != nil {
		s.hostService.Close()
	}
	if s.hosts != nil {
		errs = append(errs, s.hosts.remove())
	}
	if s.hostDir != "" {
		os.RemoveAll(s.hostDir)
	}
	// The empty cgroup parents the runtimes made.
	for _, cg := range []string{cgroupParent, runcCgroupParent} {
		os.Remove(filepath.Join("/sys/fs/cgroup", cg))
	}
	return errors.Join(errs...)
}

// server is a running `warren serve`.
type server struct {
	dataDir string
	// ownsFS: dataDir is a loop-mounted file system the suite made.
	ownsFS  bool
	args    []string
	proc    *seckit.Proc
	logPath string
	logFile *os.File
	apiURL  string
	// proxyURL is the sandbox proxy; apiPort and proxyPort their ports.
	proxyURL           string
	apiPort, proxyPort int
	flags              map[string]bool
	// prefix, cidr, runDir and cgroupParent are this server's names.
	prefix, cidr, runDir, cgroupParent string
	// tlsAddr is the HTTPS proxy's address, when the build has it.
	tlsAddr string
	// egressPort is the egress proxy's host port (issue 14), when the
	// build has it.
	egressPort int
	// metricsAddr is --metrics-addr, when the build has it (issue 17).
	metricsAddr string
}

// runtime is the server's --runtime.
func (v *server) runtime() string {
	for i, a := range v.args {
		if a == "--runtime" && i+1 < len(v.args) {
			return v.args[i+1]
		}
	}
	return "runsc"
}

// has tells whether the server has flag (without the dashes).
func (v *server) has(flag string) bool { return v.flags[flag] }

// requireFlag fails the test if the server lacks flag: the finding it
// belongs to is not fixed in this build.
func requireFlag(t *testing.T, flag, finding string) {
	t.Helper()
	if !S.srv.has(flag) {
		t.Fatalf("warren serve has no --%s flag: %s is not fixed in this build", flag, finding)
	}
}

// start runs `warren serve` on the data dir on free loopback ports and
// waits for /health. extra are flags on top of the suite's.
func (v *server) start(s *suite, extra []string) error {
	var err error
	if v.flags, err = serveFlags(s.warren); err != nil {
		return err
	}
	if v.prefix == "" {
		v.prefix, v.cidr, v.runDir, v.cgroupParent = netPrefix, netCIDR, runDir, cgroupParent
	}
	if v.args == nil {
		if v.apiPort, err = freePort(); err != nil {
			return err
		}
		if v.proxyPort, err = freePort(); err != nil {
			return err
		}
		v.args = []string{"serve", "--data-dir", v.dataDir,
			"--api-addr", fmt.Sprintf("127.0.0.1:%d", v.apiPort), "--proxy-addr", fmt.Sprintf("127.0.0.1:%d", v.proxyPort),
			"--network-prefix", v.prefix, "--network-cidr", v.cidr, "--run-dir", v.runDir,
			"--cgroup-parent", v.cgroupParent, "--pool-size", "0"}
		// What the fixes add, when this build has it: the test resolver,
		// small build disks and uploads (cheap to fill).
		for flag, val := range map[string]string{
			"resolv-conf":   s.resolvConf,
			"build-disk-mb": strconv.Itoa(buildDiskMB),
			"max-upload-mb": strconv.Itoa(maxUploadMB),
			// Paused sandboxes are reaped soon (the retention case waits).
			"paused-retention":        pausedRetention.String(),
			"allow-insecure-registry": fmt.Sprintf("127.0.0.1:%d", s.allowedRegistry),
			// Small volumes, few per team: cheap to fill and to exhaust.
			"volume-quota":         strconv.Itoa(volumeQuotaMB),
			"max-volumes-per-team": strconv.Itoa(maxVolumesPerTeam),
		} {
			if v.has(flag) {
				v.args = append(v.args, "--"+flag, val)
			}
		}
		// The HTTPS proxy (issue 12) on a loopback address of the suite's
		// own, so that it never meets another server's :443.
		if v.has("proxy-tls-addr") {
			port, err := freePort()
			if err != nil {
				return err
			}
			v.tlsAddr = fmt.Sprintf("%s:%d", tlsHost, port)
			v.args = append(v.args, "--proxy-tls-addr", v.tlsAddr)
		}
		if v.has("egress-proxy-port") {
			if v.egressPort, err = freePort(); err != nil {
				return err
			}
			v.args = append(v.args, "--egress-proxy-port", strconv.Itoa(v.egressPort))
		}
		if v.has("metrics-addr") {
			port, err := freePort()
			if err != nil {
				return err
			}
			v.metricsAddr = fmt.Sprintf("127.0.0.1:%d", port)
			v.args = append(v.args, "--metrics-addr", v.metricsAddr)
		}
		v.args = append(v.args, extra...)
	}
	return v.run(s)
}

// run starts the process with v.args and waits until it is healthy.
func (v *server) run(s *suite) error {
	if v.logFile == nil {
		f, err := os.CreateTemp("", "warren-sec-serve-*.log")
		if err != nil {
			return err
		}
		v.logFile, v.logPath = f, f.Name()
	}
	cmd := exec.Command(s.warren, v.args...)
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WARREN_API_KEY=") && !strings.HasPrefix(kv, "WARREN_ACCESS_TOKEN=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	var err error
	if v.proc, err = seckit.StartProc(cmd, v.logFile, "warren serve"); err != nil {
		return err
	}
	v.apiURL = fmt.Sprintf("http://127.0.0.1:%d", v.apiPort)
	v.proxyURL = fmt.Sprintf("http://127.0.0.1:%d", v.proxyPort)
	healthy, exited := v.proc.WaitHealthy(v.apiURL+"/health", 50*time.Millisecond)
	switch {
	case exited:
		v.proc = nil
		return fmt.Errorf("warren serve exited during start (%v):\n%s", v.args, v.logTail(4096))
	case healthy:
		return nil
	}
	v.stop()
	return fmt.Errorf("warren serve did not answer /health within 90s:\n%s", v.logTail(4096))
}

// stop ends the server with SIGTERM (SIGKILL after 20s). Sandboxes keep
// running: kill them first.
func (v *server) stop() error {
	if v.proc == nil {
		return nil
	}
	defer func() { v.proc = nil }()
	if err := v.proc.Stop(); err != nil {
		return fmt.Errorf("warren serve %w", err)
	}
	return nil
}

func (v *server) logText() string {
	b, _ := os.ReadFile(v.logPath)
	return string(b)
}

func (v *server) logTail(n int) string {
	b := v.logText()
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return b
}

// credentials reads DATA/credentials.
func (v *server) credentials() (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(v.dataDir, "credentials"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, val, ok := strings.Cut(sc.Text(), "="); ok {
			out[k] = val
		}
	}
	return out, nil
}

// removeDataDir unmounts the data dir's file system and removes it.
func (v *server) removeDataDir() error {
	if v.dataDir == "" {
		return nil
	}
	if !v.ownsFS {
		return os.RemoveAll(v.dataDir)
	}
	if err := unix.Unmount(v.dataDir, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmounting the data dir %s: %w", v.dataDir, err)
	}
	os.Remove(v.dataDir + ".img")
	return os.Remove(v.dataDir)
}

// freeMB is the free space of the data dir's file system.
func (v *server) freeMB() int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(v.dataDir, &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * st.Bsize >> 20
}

// leftovers lists what of the stopped server is still on the machine:
// mounts below its data dir, its network namespaces and veths, cgroups
// below its parent, runsc processes of its run dir.
func (v *server) leftovers() error {
	var found []string
	poll.Within(10*time.Second, 200*time.Millisecond, func() bool {
		found = found[:0]
		if ms := mountsBelow(v.dataDir + "/"); len(ms) > 0 {
			found = append(found, fmt.Sprintf("mounts %v", ms))
		}
		if ns := netnsWithPrefix(v.prefix + "-"); len(ns) > 0 {
			found = append(found, fmt.Sprintf("network namespaces %v", ns))
		}
		if links := linksWithPrefix(v.prefix + "v"); len(links) > 0 {
			found = append(found, fmt.Sprintf("veths %v", links))
		}
		if cgs := cgroupsBelow(v.cgroupParent); len(cgs) > 0 {
			found = append(found, fmt.Sprintf("cgroups %v", cgs))
		}
		if ps := processesMatching(v.runDir + "/"); len(ps) > 0 {
			found = append(found, fmt.Sprintf("processes %v", ps))
		}
		return len(found) == 0
	})
	if len(found) > 0 {
		return fmt.Errorf("left behind by warren serve: %s", strings.Join(found, "; "))
	}
	return nil
}

// removeRules deletes the server's nftables tables, which warren serve
// leaves on exit for the sandboxes that outlive it (there are none now).
func (v *server) removeRules() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tables, err := c.ListTables()
	if err != nil {
		return err
	}
	for _, t := range tables {
		if t.Name == "warren_"+v.prefix || t.Name == "warren_"+v.prefix+"_nat" {
			c.DelTable(t)
		}
	}
	return c.Flush()
}

// mountOptions returns the per-mount options of every mount point below
// prefix.
func mountOptions(prefix string) map[string]string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && strings.HasPrefix(f[4], prefix) {
			out[f[4]] = f[5]
		}
	}
	return out
}

// What the suites share (internal/seckit).
var (
	serveFlags        = seckit.ServeFlags
	freePort          = seckit.FreePort
	newDataDir        = seckit.NewDataDir
	populateDataDir   = seckit.PopulateDataDir
	mountsBelow       = seckit.MountsBelow
	netnsWithPrefix   = seckit.NetnsWithPrefix
	linksWithPrefix   = seckit.LinksWithPrefix
	cgroupsBelow      = seckit.CgroupsBelow
	processesMatching = seckit.ProcessesMatching
)

// canaries are host files planted as attack targets, with the contents
// they must keep.
type canaries struct {
	mu    sync.Mutex
	files map[string][]byte
}

// plant creates a host file (or, with dir, a directory holding one file)
// under the suite's host dir and records it.
func (c *canaries) plant(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(S.hostDir, name)
	content := []byte("host canary " + name + ": must never change\n")
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.files[p] = content
	c.mu.Unlock()
	return p
}

// plantDir creates an empty host directory and records that it must stay
// empty.
func (c *canaries) plantDir(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(S.hostDir, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.files[p] = nil
	c.mu.Unlock()
	return p
}

// absent records a host path that must never come to exist.
func (c *canaries) absent(name string) string {
	p := filepath.Join(S.hostDir, name)
	c.mu.Lock()
	c.files[p] = []byte{}
	c.mu.Unlock()
	return p
}

// check reports every planted file that changed, and plants it again so
// that one successful attack does not fail every later case.
func (c *canaries) check() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var bad []string
	for p, want := range c.files {
		switch {
		case want == nil: // a directory that must stay empty
			ents, err := os.ReadDir(p)
			if err != nil || len(ents) > 0 {
				bad = append(bad, fmt.Sprintf("host dir %s: %d entries, %v", p, len(ents), err))
				os.RemoveAll(p)
				os.Mkdir(p, 0o755)
			}
		case len(want) == 0: // must not exist
			if _, err := os.Lstat(p); err == nil {
				bad = append(bad, "host path "+p+" was created")
				os.RemoveAll(p)
			}
		default:
			fi, err := os.Lstat(p)
			got, rerr := os.ReadFile(p)
			if err != nil || rerr != nil || !fi.Mode().IsRegular() || !bytes.Equal(got, want) {
				bad = append(bad, fmt.Sprintf("host file %s changed: now %q (%v %v)", p, trim(got), err, rerr))
				os.RemoveAll(p)
				os.WriteFile(p, want, 0o644)
			}
		}
	}
	return bad
}

func trim(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}
