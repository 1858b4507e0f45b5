package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
)

var backends = []string{"runc", "runsc"}

// TestLifecycle runs one sandbox per backend through start, stats, pause,
// resume, the memory limit, kill and delete.
func TestLifecycle(t *testing.T) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) { testLifecycle(t, name) })
	}
}

func testLifecycle(t *testing.T, name string) {
	rt := newTestRuntime(t, name)
	ctx := context.Background()
	sb := newSpec(t, fmt.Sprintf("lc-%s-%d", name, os.Getpid()))
	id, ip := sb.spec.ID, sb.net.sandboxIP
	t.Cleanup(func() { rt.Delete(context.Background(), id) })

	start := time.Now()
	if err := rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	started := time.Since(start)
	ready := waitHealthy(t, ip, 15*time.Second)
	t.Logf("%s: Start returned in %v, envd healthy %v later", name, started.Round(time.Millisecond), ready.Round(time.Millisecond))

	if err := rt.Start(ctx, sb.spec); !errors.Is(err, ErrExists) {
		t.Errorf("second Start: %v, want ErrExists", err)
	}
	if st, err := rt.State(ctx, id); err != nil || st != StateRunning {
		t.Fatalf("State: %v %v, want running", st, err)
	}
	pid := listed(t, rt, id, StateRunning)

	// Stats come from the cgroup.
	st, err := rt.Stats(ctx, id)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	t.Logf("%s: stats %+v", name, st)
	if st.CPUUsageNs == 0 || st.MemoryBytes == 0 || st.Pids == 0 {
		t.Errorf("Stats has zeros: %+v", st)
	}
	if st.MemoryLimitBytes != 128<<20 {
		t.Errorf("MemoryLimitBytes = %d, want %d", st.MemoryLimitBytes, 128<<20)
	}

	// Inside: hostname, and rootfs writes land in the host upper dir
	// (for runsc that is --overlay2=none at work).
	if out, err := sandboxExec(rt, id, "hostname"); err != nil || strings.TrimSpace(out) != sb.spec.Hostname {
		t.Errorf("hostname in sandbox: %q %v, want %q", out, err, sb.spec.Hostname)
	}
	if out, err := sandboxExec(rt, id, "sh", "-c", "echo hello > /root/marker"); err != nil {
		t.Errorf("write in sandbox: %v %s", err, out)
	} else if b, err := os.ReadFile(filepath.Join(sb.fs.upper, "root/marker")); err != nil || string(b) != "hello\n" {
		t.Errorf("write did not reach the overlay upper dir: %q %v", b, err)
	}

	// Pause: envd stops answering; pausing twice is fine.
	if err := rt.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := rt.Pause(ctx, id); err != nil {
		t.Errorf("second Pause: %v", err)
	}
	if st, _ := rt.State(ctx, id); st != StatePaused {
		t.Errorf("State after Pause = %s", st)
	}
	if err := healthy(ip, 700*time.Millisecond); err == nil {
		t.Errorf("envd answered while paused")
	}
	if err := rt.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := rt.Resume(ctx, id); err != nil {
		t.Errorf("second Resume: %v", err)
	}
	waitHealthy(t, ip, 5*time.Second)

	// Kill: stopped, envd gone, the sandbox still listed until Delete.
	t0 := time.Now()
	if err := rt.Kill(ctx, id); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	killed := time.Since(t0)
	if st, err := rt.State(ctx, id); err != nil || st != StateStopped {
		t.Errorf("State after Kill: %v %v, want stopped", st, err)
	}
	if err := rt.Kill(ctx, id); err != nil {
		t.Errorf("second Kill: %v", err)
	}
	if err := healthy(ip, 300*time.Millisecond); err == nil {
		t.Errorf("envd answered after Kill")
	}
	t0 = time.Now()
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	t.Logf("%s: Kill %v, Delete %v", name, killed.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	assertGone(t, rt, id, pid)
	if err := rt.Delete(ctx, id); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

// TestMemoryLimit allocates past MemoryMB inside a sandbox: busybox dd
// with a 200 MB block size mallocs and fills a 200 MB buffer, under a
// 128 MB limit.
//
// runc: the kernel's memcg OOM killer kills the biggest process in the
// cgroup, dd; envd and the sandbox live on.
//
// runsc: every guest page lives in the sentry's memory file, so the host
// OOM killer's biggest process is the sentry itself: the whole sandbox
// dies and is reported stopped. gVisor has no guest OOM killer of its own
// (it sizes the guest's memory from the limit but does not enforce it).
func TestMemoryLimit(t *testing.T) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			rt := newTestRuntime(t, name)
			ctx := context.Background()
			sb := newSpec(t, fmt.Sprintf("mem-%s-%d", name, os.Getpid()))
			t.Cleanup(func() { rt.Delete(context.Background(), sb.spec.ID) })
			if err := rt.Start(ctx, sb.spec); err != nil {
				t.Fatalf("Start: %v", err)
			}
			waitHealthy(t, sb.net.sandboxIP, 15*time.Second)
			out, err := sandboxExec(rt, sb.spec.ID, "dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1")
			t.Logf("%s: dd of 200 MB under a 128 MB limit: err=%v out=%q", name, err, strings.TrimSpace(out))
			if err == nil {
				t.Fatalf("allocating 200 MB under a 128 MB limit succeeded")
			}
			var st State
			poll.Within(5*time.Second, 20*time.Millisecond, func() bool {
				st, err = rt.State(ctx, sb.spec.ID)
				return err != nil || name == "runc" || st == StateStopped
			})
			herr := healthy(sb.net.sandboxIP, 2*time.Second)
			t.Logf("%s: after the OOM kill: state=%s (%v), envd health: %v", name, st, err, herr)
			switch name {
			case "runc":
				if st != StateRunning || herr != nil {
					t.Errorf("runc: envd should survive the OOM kill of dd: state %s, health %v", st, herr)
				}
			case "runsc":
				if st != StateStopped {
					t.Errorf("runsc: want the sandbox stopped after its sentry was OOM-killed, got %s", st)
				}
			}
			if err := rt.Delete(ctx, sb.spec.ID); err != nil {
				t.Errorf("Delete: %v", err)
			}
			assertGone(t, rt, sb.spec.ID, 0)
		})
	}
}

// listed finds id in List with the wanted state and returns its PID.
func listed(t *testing.T, rt Runtime, id string, want State) int {
	t.Helper()
	cs, err := rt.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, c := range cs {
		if c.ID == id {
			if c.State != want {
				t.Errorf("List: %s is %s, want %s", id, c.State, want)
			}
			return c.Pid
		}
	}
	t.Fatalf("List: %s missing from %+v", id, cs)
	return 0
}

func TestDeleteUnknownIsNoop(t *testing.T) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			rt := newTestRuntime(t, name)
			if err := rt.Delete(context.Background(), "never-existed"); err != nil {
				t.Errorf("Delete of unknown ID: %v", err)
			}
			for _, f := range []func() error{
				func() error { return rt.Pause(context.Background(), "never-existed") },
				func() error { _, err := rt.Stats(context.Background(), "never-existed"); return err },
				func() error { return rt.Kill(context.Background(), "never-existed") },
			} {
				if err := f(); !errors.Is(err, ErrNotFound) {
					t.Errorf("got %v, want ErrNotFound", err)
				}
			}
		})
	}
}

// TestStartFailureCleansUp: a Start that fails says why and leaves
// nothing behind, so the ID can be used again.
func TestStartFailureCleansUp(t *testing.T) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			rt := newTestRuntime(t, name)
			sb := newSpec(t, fmt.Sprintf("fail-%s-%d", name, os.Getpid()))
			sb.spec.NetNSPath = "/var/run/netns/warren-test-missing"
			err := rt.Start(context.Background(), sb.spec)
			t.Logf("%s: Start with a missing netns: %v", name, err)
			if err == nil {
				rt.Delete(context.Background(), sb.spec.ID)
				t.Fatal("Start succeeded without its netns")
			}
			if !strings.Contains(err.Error(), "warren-test-missing") {
				t.Errorf("the error does not say what is wrong: %v", err)
			}
			assertGone(t, rt, sb.spec.ID, 0)
		})
	}
}

// The runsc that EnsureRunsc builds loads the sentry's seccomp filters
// precompiled for Warren's flags instead of compiling them at every boot
// (install.go): its debug log says so.
func TestRunscUsesPrecompiledSeccomp(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bin, err := EnsureRunsc(ctx, runscCache, tlog{t})
	if err != nil {
		t.Fatalf("EnsureRunsc: %v", err)
	}
	rt, err := NewRunsc(Config{Binary: bin, StateDir: filepath.Join(stateBase, "runsc-seccomp"), CgroupParent: testCgroupParent, RunscFlags: []string{"--debug"}})
	if err != nil {
		t.Fatal(err)
	}
	sb := newSpec(t, fmt.Sprintf("seccomp-%d", os.Getpid()))
	t.Cleanup(func() { rt.Delete(context.Background(), sb.spec.ID) })
	if err := rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	waitHealthy(t, sb.net.sandboxIP, 15*time.Second)
	log, err := os.ReadFile(filepath.Join(rt.sandboxDir(sb.spec.ID), "runsc.boot.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "Loaded precompiled seccomp instructions") {
		t.Errorf("the sentry compiled its seccomp filters at boot: no precompiled program matched (runsc.boot.log: %d bytes)", len(log))
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, "seccomp") {
				t.Log(l)
			}
		}
	}
}

// A background sandbox starts with a CPU weight below the default and
// gets the default from Foreground.
func TestBackgroundCPUWeight(t *testing.T) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			rt := newTestRuntime(t, name)
			sb := newSpec(t, fmt.Sprintf("bg-%s-%d", name, os.Getpid()))
			sb.spec.Background = true
			t.Cleanup(func() { rt.Delete(context.Background(), sb.spec.ID) })
			if err := rt.Start(context.Background(), sb.spec); err != nil {
				t.Fatalf("Start: %v", err)
			}
			b := baseOf(rt)
			dir, v2, ok := b.cgroups.dir("cpu", b.cgroupPath(sb.spec.ID))
			if !ok {
				t.Skip("this host has no cpu cgroup controller")
			}
			file, def := filepath.Join(dir, "cpu.shares"), defaultShares
			if v2 {
				file, def = filepath.Join(dir, "cpu.weight"), defaultWeight
			}
			weight := func() int {
				data, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				n, err := strconv.Atoi(strings.TrimSpace(string(data)))
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			if w := weight(); w >= def {
				t.Errorf("a background sandbox's %s is %d; want less than the default %d", filepath.Base(file), w, def)
			}
			if err := rt.Foreground(sb.spec.ID); err != nil {
				t.Fatalf("Foreground: %v", err)
			}
			if w := weight(); w != def {
				t.Errorf("after Foreground, %s is %d; want the default %d", filepath.Base(file), w, def)
			}
		})
	}
}
