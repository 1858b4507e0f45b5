package codeinterp

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestChooseVictim(t *testing.T) {
	a, b := &execContext{ID: "a"}, &execContext{ID: "b"}
	groups := []guardGroup{{c: a, pgid: 100}, {c: b, pgid: 200}}
	const user, root = 1000, 0
	procs := []procInfo{
		{PID: 1, PGID: 1, UID: root, RSS: 900 << 20}, // envd: never
		{PID: 100, PGID: 100, UID: user, RSS: 30 << 20},
		{PID: 101, PGID: 100, UID: user, RSS: 40 << 20},
		{PID: 200, PGID: 200, UID: user, RSS: 50 << 20},
		{PID: 300, PGID: 300, UID: user, RSS: 60 << 20}, // a stray
	}
	// Group a holds 70 MiB in two processes, more than b and the stray.
	v, ok := chooseVictim(procs, groups, user, true)
	if !ok || v.Context != a || v.PGID != 100 || v.Bytes != 70<<20 {
		t.Fatalf("victim = %+v, %v; want group a with 70 MiB", v, ok)
	}
	// A stray bigger than every group: the stray alone.
	procs = append(procs, procInfo{PID: 301, PGID: 301, UID: user, RSS: 500 << 20})
	v, ok = chooseVictim(procs, groups, user, true)
	if !ok || v.Context != nil || v.PID != 301 {
		t.Fatalf("victim = %+v, %v; want the stray 301", v, ok)
	}
	// Without strays (the kernels run as the server's own user), only a
	// group.
	v, ok = chooseVictim(procs, groups, user, false)
	if !ok || v.Context != a {
		t.Fatalf("victim = %+v, %v; want group a", v, ok)
	}
	// Nothing of the user's: nothing to kill, root's processes least of all.
	if v, ok := chooseVictim(procs[:1], groups, user, true); ok {
		t.Fatalf("victim = %+v among root's processes", v)
	}
	if v, ok := chooseVictim(procs, nil, 4242, true); ok {
		t.Fatalf("victim = %+v of another user", v)
	}
}

func TestBusyVictim(t *testing.T) {
	a, b, c := &execContext{ID: "a"}, &execContext{ID: "b"}, &execContext{ID: "c"}
	groups := []guardGroup{{c: a, pgid: 1}, {c: b, pgid: 2, busy: true}, {c: c, pgid: 3}}
	if v, ok := busyVictim(groups); !ok || v.Context != b || v.PGID != 2 {
		t.Fatalf("busyVictim = %+v, %v; want b, the one running a cell", v, ok)
	}
	groups[2].busy = true // two cells run: which allocates is for /proc to say
	if v, ok := busyVictim(groups); ok {
		t.Fatalf("busyVictim = %+v with two busy contexts", v)
	}
	if v, ok := busyVictim(groups[:1]); ok {
		t.Fatalf("busyVictim = %+v with none busy", v)
	}
}

func TestUnderPressureAndReserve(t *testing.T) {
	const total = 2048 << 20
	if r := defaultReserve(total); r != 256<<20 {
		t.Errorf("reserve of 2 GiB = %d MiB, want 256", r>>20)
	}
	if r := defaultReserve(256 << 20); r != 64<<20 {
		t.Errorf("reserve of 256 MiB = %d MiB, want the floor, 64", r>>20)
	}
	for _, c := range []struct {
		m    memInfo
		want bool
	}{
		{memInfo{Total: total, Available: 1 << 30}, false},
		{memInfo{Total: total, Available: 128 << 20}, false},
		{memInfo{Total: total, Available: 127 << 20}, true},
		{memInfo{Total: 0, Available: 0}, false}, // unreadable: no kill
	} {
		if got := underPressure(c.m, 128<<20); got != c.want {
			t.Errorf("underPressure(%+v) = %v, want %v", c.m, got, c.want)
		}
	}
}

func TestReadMemInfo(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	os.WriteFile(p, []byte("MemTotal:        2097152 kB\nMemFree:         1000000 kB\nMemAvailable:    1048576 kB\nBuffers: 0 kB\n"), 0o644)
	m, err := readMemInfo(p)
	if err != nil || m.Total != 2<<30 || m.Available != 1<<30 {
		t.Fatalf("readMemInfo = %+v, %v", m, err)
	}
	os.WriteFile(p, []byte("MemTotal:        2097152 kB\n"), 0o644)
	if _, err := readMemInfo(p); err == nil {
		t.Fatal("a meminfo without MemAvailable was read")
	}
	// This machine's own.
	if m, err := readMemInfo("/proc/meminfo"); err != nil || m.Total == 0 || m.Available > m.Total {
		t.Fatalf("/proc/meminfo: %+v, %v", m, err)
	}
}

func TestReadProcsSeesThisProcess(t *testing.T) {
	procs, err := readProcs("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.PID == os.Getpid() {
			if p.PGID != syscall.Getpgrp() || p.UID != uint32(os.Getuid()) || p.RSS < 1<<20 {
				t.Fatalf("this process: %+v", p)
			}
			return
		}
	}
	t.Fatalf("this process (%d) is not among %d", os.Getpid(), len(procs))
}

// startGroup starts a shell in a process group of its own that keeps
// forking sleeps (a small, bounded fork loop) and returns its pid.
func startGroup(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "for i in $(seq 200); do sleep 60 & sleep 0.01; done; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd.Process.Pid
}

func TestKillGroupEndsEveryProcessOfTheGroup(t *testing.T) {
	pgid := startGroup(t)
	time.Sleep(200 * time.Millisecond) // some sleeps forked
	if !killGroup(pgid, 10*time.Second) {
		t.Fatal("the group outlived killGroup")
	}
	if err := syscall.Kill(-pgid, 0); err != syscall.ESRCH {
		t.Fatalf("kill -0 of the group after killGroup: %v", err)
	}
}

// The guard, fed a fake view of the guest: no pressure, no kill; under
// pressure, the context whose group holds the most loses its kernel, and
// its running execution learns why.
func TestCheckMemoryKillsTheBiggestContext(t *testing.T) {
	s, err := New(Config{RunDir: t.TempDir(), MemoryCheckInterval: -1, User: nil})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mem := memInfo{Total: 2 << 30, Available: 1 << 30}
	s.memInfo = func() (memInfo, error) { return mem, nil }
	// Two contexts whose "kernels" are process groups of this test.
	small, big := startGroup(t), startGroup(t)
	var ctxs []*execContext
	for _, pgid := range []int{small, big} {
		c, err := s.newContext("python", "/")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func(pid int) {
			for syscall.Kill(pid, 0) == nil {
				time.Sleep(10 * time.Millisecond)
			}
			close(done)
		}(pgid)
		r, w, _ := os.Pipe()
		r.Close()
		c.k = &kernel{pid: pgid, dir: t.TempDir(), done: done, in: w, events: make(chan []byte), stop: make(chan struct{})}
		ctxs = append(ctxs, c)
	}
	s.procs = func() ([]procInfo, error) {
		return []procInfo{
			{PID: small, PGID: small, UID: 0, RSS: 10 << 20},
			{PID: big, PGID: big, UID: 0, RSS: 300 << 20},
			{PID: 1, PGID: 1, UID: 4242, RSS: 1 << 30}, // another user's
		}, nil
	}
	var g guard
	if v, killed := s.checkMemory(&g); killed || g.near {
		t.Fatalf("killed %+v with 1 GiB available (near: %v)", v, g.near)
	}
	mem.Available = 600 << 20 // within 3 reserves of 256 MiB: closer watch
	if v, killed := s.checkMemory(&g); killed || !g.near {
		t.Fatalf("killed %+v with 600 MiB available (near: %v)", v, g.near)
	}
	mem.Available = 200 << 20 // below the reserve, 1/8 of 2 GiB
	v, killed := s.checkMemory(&g)
	if !killed || v.Context != ctxs[1] || v.PGID != big {
		t.Fatalf("victim = %+v, %v; want the big context", v, killed)
	}
	if !strings.HasPrefix(ctxs[1].k.killReason(), outOfMemoryReason) || ctxs[1].k.alive() {
		t.Fatalf("big kernel: alive %v, reason %q", ctxs[1].k.alive(), ctxs[1].k.killReason())
	}
	if !killGroup(big, 10*time.Second) {
		t.Fatal("the big group outlived the guard")
	}
	if !ctxs[0].k.alive() || syscall.Kill(-small, 0) != nil {
		t.Fatal("the small context's group was killed too")
	}
	if ev := string(deathEvent(ctxs[1].k.killReason())); !strings.Contains(ev, `"name":"KernelDied"`) || !strings.Contains(ev, "300 MiB") {
		t.Fatalf("the cell's error: %s", ev)
	}
}

// Every kernel runs under RLIMIT_NPROC, soft and hard (a cell of the
// sandbox's user cannot raise it), whatever its language.
func TestKernelsRunUnderTheProcessLimit(t *testing.T) {
	_, hs := newTestServer(t, func(c *Config) { c.MaxUserProcesses = 300 })
	x := run(t, hs, code("import resource; resource.getrlimit(resource.RLIMIT_NPROC)"))
	if x.text() != "(300, 300)" {
		t.Fatalf("python: %v", x.events)
	}
	x = run(t, hs, map[string]any{"code": "ulimit -Su; ulimit -Hu", "language": "bash"})
	if x.stdout() != "300\n300\n" {
		t.Fatalf("bash: %v", x.events)
	}
}

// While a victim is still exiting, the guard kills it again rather than a
// second context; once the grace has passed with memory still short, it
// picks the next.
func TestCheckMemoryWaitsForItsVictim(t *testing.T) {
	s, err := New(Config{RunDir: t.TempDir(), MemoryCheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.memInfo = func() (memInfo, error) { return memInfo{Total: 2 << 30, Available: 10 << 20}, nil }
	procs := []procInfo{{PID: 50, PGID: 50, RSS: 10 << 20}, {PID: 60, PGID: 60, RSS: 300 << 20}}
	s.procs = func() ([]procInfo, error) { return procs, nil }
	var signalled []int
	alive := map[int]bool{-50: true, -60: true}
	s.signal = func(pid int, sig syscall.Signal) error {
		signalled = append(signalled, pid)
		if !alive[pid] {
			return syscall.ESRCH
		}
		return nil
	}
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	for _, pgid := range []int{50, 60} {
		c, _ := s.newContext("python", "/")
		c.k = &kernel{pid: pgid, done: make(chan struct{}), stop: make(chan struct{})}
		c.k.killOnce.Do(func() {}) // a fake: its kill is the signal above
	}
	var g guard
	if v, killed := s.checkMemory(&g); !killed || v.PGID != 60 {
		t.Fatalf("first victim %+v, %v; want group 60", v, killed)
	}
	clock = clock.Add(killGrace / 2)
	if v, killed := s.checkMemory(&g); killed || v.PGID != 60 {
		t.Fatalf("within the grace: %+v, %v; want group 60 killed again, no new victim", v, killed)
	}
	if got := signalled[len(signalled)-1]; got != -60 {
		t.Fatalf("signalled %v", signalled)
	}
	// Gone, within the grace: the next one is chosen (its memory is
	// what is still short).
	alive[-60] = false
	procs = procs[:1]
	if v, killed := s.checkMemory(&g); !killed || v.PGID != 50 {
		t.Fatalf("after the first victim exited: %+v, %v; want group 50", v, killed)
	}
}
