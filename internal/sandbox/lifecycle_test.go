package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// The lifecycle tests run runsc sandboxes: pausing with memory needs its
// checkpoints.

func startRunsc(t *testing.T, st store.Store, cfg Config) *env {
	return startWith(t, st, cfg, envOptions{runtime: "runsc"})
}

// run runs a bash script in a sandbox through envd, as the sandbox's
// default user, and returns its output.
func run(t *testing.T, m *Manager, rec store.Sandbox, script string) string {
	t.Helper()
	l, err := m.lookup(store.AllTeams(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	inst := m.instance(l)
	if inst == nil {
		t.Fatalf("%s is paused", rec.ID)
	}
	c := processconnect.NewProcessClient(&http.Client{Transport: l.transport}, inst.EnvdURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Straight to envd, as the proxy does: once its /init is done.
	if err := l.initialised(ctx); err != nil {
		t.Fatal(err)
	}
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}})
	req.Header().Set("X-Access-Token", rec.EnvdAccessToken)
	stream, err := c.Start(ctx, req)
	if err != nil {
		t.Fatalf("run in %s: %v", rec.ID, err)
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		out.Write(stream.Msg().GetEvent().GetData().GetStdout())
		out.Write(stream.Msg().GetEvent().GetData().GetStderr())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("run in %s: %v (output %q)", rec.ID, err, out.String())
	}
	return out.String()
}

// counterLoop starts a shell loop that counts in its memory and prints
// the count and its pid to a file on demand.
const counterLoop = `nohup bash -c 'n=0; while true; do n=$((n+1)); echo "$n $$" > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done' >/dev/null 2>&1 &
sleep 0.5; cat /tmp/count`

// released waits until a pause has released everything (that part runs
// after Pause has answered, holding the sandbox's lock).
func released(t *testing.T, m *Manager, id string) {
	t.Helper()
	l, err := m.lookup(store.AllTeams(), id)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	l.mu.Unlock()
}

func count(t *testing.T, m *Manager, rec store.Sandbox) (n, pid int) {
	t.Helper()
	out := run(t, m, rec, "cat /tmp/count")
	if _, err := fmt.Sscanf(out, "%d %d", &n, &pid); err != nil {
		t.Fatalf("count in %s: %q", rec.ID, out)
	}
	return n, pid
}

// countPast reads the count until it is past n, for up to five seconds,
// and returns the last read.
func countPast(t *testing.T, m *Manager, rec store.Sandbox, n int) (got, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got, pid = count(t, m, rec)
		if got > n || time.Now().After(deadline) {
			return got, pid
		}
	}
}

// Pause with memory: the sandbox holds nothing of the node (no container,
// no slot, no capacity), a second pause says false, and connect restores
// it with the same pid, its count going on, its files and its tokens; a
// resume starts a new term.
func TestPauseToDiskAndConnect(t *testing.T) {
	e := startRunsc(t, newStore(t), Config{MaxSandboxes: 1})
	defer e.destroy()
	ctx := context.Background()
	rec, err := e.create(CreateRequest{Timeout: time.Minute, Metadata: map[string]string{"k": "v"}, EnvVars: map[string]string{"MINE": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, e.mgr, rec, counterLoop+"; echo kept > /home/user/file")
	before, pid := count(t, e.mgr, rec)
	// An exchange the proxy carries ends with the pause, as with a kill.
	ended := make(chan struct{})
	if _, err := e.mgr.Track(rec.ID, func() { close(ended) }); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, true); !ok || err != nil {
		t.Fatalf("pause: %v %v", ok, err)
	}
	select {
	case <-ended:
	default:
		t.Error("the pause did not end the proxied exchange")
	}
	if _, err := e.mgr.Track(rec.ID, func() {}); !errors.Is(err, proxy.ErrTransitioning) {
		t.Errorf("Track of the paused sandbox: %v", err)
	}
	if ok, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, true); ok || err != nil {
		t.Errorf("second pause: %v %v, want false", ok, err)
	}
	released(t, e.mgr, rec.ID)
	paused, _ := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID)
	if paused.State != store.StatePaused || paused.Slot != "" || paused.RootfsDir == "" || paused.Checkpoint == "" {
		t.Errorf("paused record: state %s slot %q rootfs %q checkpoint %q", paused.State, paused.Slot, paused.RootfsDir, paused.Checkpoint)
	}
	// Its kept files count for its team's disk quota (issue 22), measured
	// once saved.
	var usage store.TeamDisk
	if !poll.Within(10*time.Second, 20*time.Millisecond, func() bool {
		usage, _ = e.store.TeamDiskUsage(ctx, "t1")
		return usage.Paused > 0
	}) {
		t.Errorf("the paused sandbox's disk use was not recorded: %+v", usage)
	}
	if _, err := e.mgr.cfg.Node.Runtime().State(ctx, rec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("its container after the pause: %v", err)
	}
	// Paused, it holds none of the node's capacity (MaxSandboxes 1).
	other, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatalf("a create beside a paused sandbox on a node for one: %v", err)
	}
	if _, _, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("resuming on a full node: %v", err)
	}
	if got, _ := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID); got.State != store.StatePaused {
		t.Errorf("after a refused resume: %s", got.State)
	}
	if err := e.mgr.Kill(ctx, team.MustParse("t1"), other.ID); err != nil {
		t.Fatal(err)
	}

	time.Sleep(1100 * time.Millisecond) // its clock stood still; the resume's new term starts now
	got, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, 90*time.Second, true)
	if !resumed || err != nil {
		t.Fatalf("connect: %v %v", resumed, err)
	}
	if got.EnvdAccessToken != rec.EnvdAccessToken || got.TrafficAccessToken != rec.TrafficAccessToken || got.Metadata["k"] != "v" {
		t.Errorf("tokens or metadata changed: %+v", got)
	}
	if left := time.Until(got.EndAt); left < 80*time.Second || left > 91*time.Second {
		t.Errorf("after the resume it ends in %v, want 90 s", left)
	}
	if got.RootfsDir != "" || got.Checkpoint != "" || got.Slot == "" || got.State != store.StateRunning {
		t.Errorf("resumed record: %+v", got)
	}
	// The loop goes on from where it was: the same process, counting past
	// the count it had (once it has run again: it sleeps between ticks).
	after, afterPid := countPast(t, e.mgr, rec, before)
	if afterPid != pid || after <= before {
		t.Errorf("count %d pid %d after resume, was %d pid %d", after, afterPid, before, pid)
	}
	if out := run(t, e.mgr, rec, "cat /home/user/file; echo $MINE"); out != "kept\nyes\n" {
		t.Errorf("files and envs after resume: %q", out)
	}
	if _, err := os.Stat(paused.Checkpoint); !os.IsNotExist(err) {
		t.Errorf("the checkpoint outlived the resume: %v", err)
	}
	// A second round.
	if ok, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, true); !ok || err != nil {
		t.Fatalf("second pause: %v %v", ok, err)
	}
	if _, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true); !resumed || err != nil {
		t.Fatalf("second connect: %v %v", resumed, err)
	}
	if _, p := count(t, e.mgr, rec); p != pid {
		t.Errorf("pid %d after the second round, want %d", p, pid)
	}
	// Without memory its files stay and its processes do not; so does
	// a resume that asks to boot.
	if ok, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, false); !ok || err != nil {
		t.Fatalf("pause without memory: %v %v", ok, err)
	}
	if got, _ := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID); got.Checkpoint != "" {
		t.Errorf("a pause without memory recorded a checkpoint %q", got.Checkpoint)
	}
	if _, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true); !resumed || err != nil {
		t.Fatalf("connect after a pause without memory: %v %v", resumed, err)
	}
	if out := run(t, e.mgr, rec, "cat /home/user/file; echo $MINE; pgrep -x sleep || echo no-loop"); out != "kept\nyes\nno-loop\n" {
		t.Errorf("after a resume without memory: %q", out)
	}
}

// A sandbox paused by its timeout (autoPause) and woken by connect gets a
// new term, so the reaper does not pause it again at once; kill of a
// paused sandbox removes its checkpoint.
func TestAutoPauseThenConnectStartsANewTerm(t *testing.T) {
	e := startRunsc(t, newStore(t), Config{ReapInterval: 100 * time.Millisecond})
	defer e.destroy()
	ctx := context.Background()
	rec, err := e.create(CreateRequest{Timeout: time.Second, AutoPause: true})
	if err != nil {
		t.Fatal(err)
	}
	if !poll.Within(20*time.Second, 50*time.Millisecond, func() bool {
		got, _ := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID)
		return got.State == store.StatePaused
	}) {
		t.Fatal("not paused on timeout within 20 s")
	}
	if _, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true); !resumed || err != nil {
		t.Fatalf("connect: %v %v", resumed, err)
	}
	time.Sleep(time.Second) // ten reaper rounds
	got, _ := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID)
	if got.State != store.StateRunning || time.Until(got.EndAt) < 50*time.Second {
		t.Errorf("after connect: %s, ends in %v", got.State, time.Until(got.EndAt))
	}
	if _, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, true); err != nil {
		t.Fatal(err)
	}
	paused, _ := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID)
	if err := e.mgr.Kill(ctx, team.MustParse("t1"), rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(paused.RootfsDir); !os.IsNotExist(err) {
		t.Errorf("a killed paused sandbox left %s: %v", paused.RootfsDir, err)
	}
	if _, err := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("after kill: %v", err)
	}
}

// failingRestore is a runtime whose restores fail while fail is set.
type failingRestore struct {
	runtime.Runtime
	mu   sync.Mutex
	fail bool
}

func (f *failingRestore) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	f.mu.Lock()
	fail := f.fail
	f.mu.Unlock()
	if fail {
		return errors.New("restore failed on purpose")
	}
	return f.Runtime.Restore(ctx, spec, dir)
}

// Every transition is recorded before the runtime acts: the running
// state (with the new slot) is written while the sandbox has no container
// yet; a resume the store refuses starts nothing; a failed restore leaves
// it paused (its record, files and checkpoint), says which step failed,
// and a later resume succeeds.
func TestResumeIsRecordedBeforeTheRuntimeActs(t *testing.T) {
	hs := &hookStore{Store: newStore(t)}
	fr := &failingRestore{}
	e := startWith(t, hs, Config{}, envOptions{runtime: "runsc", wrap: func(rt runtime.Runtime) runtime.Runtime { fr.Runtime = rt; return fr }})
	defer e.destroy()
	ctx := context.Background()
	rec, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, e.mgr, rec, counterLoop)
	_, pid := count(t, e.mgr, rec)
	if _, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, true); err != nil {
		t.Fatal(err)
	}
	var seen []string
	hs.set(func(id string, from, to store.SandboxState) error {
		if from == store.StatePaused && to == store.StateRunning {
			_, err := e.mgr.cfg.Node.Runtime().State(ctx, id)
			seen = append(seen, fmt.Sprint(errors.Is(err, runtime.ErrNotFound)))
		}
		return nil
	})
	if _, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true); !resumed || err != nil {
		t.Fatalf("connect: %v %v", resumed, err)
	}
	if fmt.Sprint(seen) != "[true]" {
		t.Errorf("the resume was recorded when the container existed already: %v", seen)
	}

	if _, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, true); err != nil {
		t.Fatal(err)
	}
	before, _ := hs.GetSandbox(ctx, rec.ID)
	hs.set(func(id string, from, to store.SandboxState) error {
		if from == store.StatePaused && to == store.StateRunning {
			return errors.New("the database is read-only")
		}
		return nil
	})
	if _, _, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true); err == nil {
		t.Error("connect succeeded though its resume could not be recorded")
	}
	if _, err := e.mgr.cfg.Node.Runtime().State(ctx, rec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("the runtime started a sandbox whose resume was not recorded: %v", err)
	}
	hs.set(nil)

	fr.mu.Lock()
	fr.fail = true
	fr.mu.Unlock()
	_, _, err = e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true)
	var re *ResumeError
	if !errors.As(err, &re) || re.Step != "restoring its memory checkpoint" {
		t.Fatalf("a failed restore: %v", err)
	}
	fr.mu.Lock()
	fr.fail = false
	fr.mu.Unlock()
	after, _ := hs.GetSandbox(ctx, rec.ID)
	if after.State != store.StatePaused || !after.PausedAt.Equal(before.PausedAt) || after.Slot != "" || after.Checkpoint != before.Checkpoint {
		t.Errorf("after a failed resume: %+v, want it as before: %+v", after, before)
	}
	if _, err := os.Stat(filepath.Join(after.Checkpoint, "checkpoint.img")); err != nil {
		t.Errorf("its checkpoint after a failed resume: %v", err)
	}
	if _, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true); !resumed || err != nil {
		t.Fatalf("a later connect: %v %v", resumed, err)
	}
	if _, p := count(t, e.mgr, rec); p != pid {
		t.Errorf("pid %d after the resume that followed a failed one, want %d", p, pid)
	}
}

// A paused sandbox survives a restart of Warren (and what a host reboot
// leaves: nothing but its files) and resumes with its memory; a pause or a
// resume the restart cut short is settled: finished or undone, never
// half-made.
func TestPausedSandboxesSurviveARestart(t *testing.T) {
	st := newStore(t)
	e := startRunsc(t, st, Config{})
	ctx := context.Background()
	paused, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	midPause, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	midResume, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{}
	for _, r := range []store.Sandbox{paused, midPause, midResume} {
		run(t, e.mgr, r, counterLoop)
		_, pids[r.ID] = count(t, e.mgr, r)
	}
	for _, r := range []store.Sandbox{paused, midResume} {
		if _, err := e.mgr.Pause(ctx, team.MustParse("t1"), r.ID, true); err != nil {
			t.Fatal(err)
		}
	}
	// midPause: the pause was recorded, then the restart came before
	// the runtime acted. midResume: the resume was recorded (running,
	// its files still named), then the restart came.
	l, _ := e.mgr.lookup(store.AllTeams(), midPause.ID)
	inst := e.mgr.instance(l)
	st.UpdateSandbox(ctx, midPause.ID, func(s *store.Sandbox) error {
		s.State, s.PausedAt, s.Slot = store.StatePaused, time.Now(), ""
		s.RootfsDir, s.Checkpoint = inst.Rootfs.Home(), inst.Rootfs.CheckpointDir()
		return nil
	})
	st.UpdateSandbox(ctx, midResume.ID, func(s *store.Sandbox) error { s.State = store.StateRunning; return nil })
	e.stop()

	e = startRunsc(t, st, Config{})
	defer e.destroy()
	for _, r := range []store.Sandbox{paused, midPause, midResume} {
		got, err := e.mgr.Get(ctx, team.MustParse("t1"), r.ID)
		if err != nil || got.State != store.StatePaused {
			t.Errorf("%s after the restart: %s %v", r.ID, got.State, err)
			continue
		}
		if _, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), r.ID, time.Minute, true); !resumed || err != nil {
			t.Errorf("resuming %s after the restart: %v %v", r.ID, resumed, err)
			continue
		}
		if _, pid := count(t, e.mgr, r); pid != pids[r.ID] {
			t.Errorf("%s: pid %d after the restart, want %d", r.ID, pid, pids[r.ID])
		}
	}
}

// A fork makes count sandboxes from the parent's live state, each its own
// (ID, tokens, slot, term); the parent runs on with its end time; they
// diverge. A snapshot of a paused sandbox is refused.
func TestForkAndSnapshot(t *testing.T) {
	e := startRunsc(t, newStore(t), Config{})
	defer e.destroy()
	ctx := context.Background()
	parent, err := e.create(CreateRequest{Timeout: time.Hour, Metadata: map[string]string{"from": "parent"}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, e.mgr, parent, counterLoop+"; echo parent > /home/user/file")
	_, pid := count(t, e.mgr, parent)
	results, err := e.mgr.Fork(ctx, team.MustParse("t1"), parent.ID, 2*time.Minute, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := e.mgr.Get(ctx, team.MustParse("t1"), parent.ID); got.EndAt.UnixMilli() != parent.EndAt.UnixMilli() || got.State != store.StateRunning {
		t.Errorf("the parent after the fork: %s ends %v, was %v", got.State, got.EndAt, parent.EndAt)
	}
	ids := map[string]bool{parent.ID: true}
	for i, r := range results {
		if r.Err != nil {
			t.Fatalf("child %d: %v", i, r.Err)
		}
		c := r.Sandbox
		if ids[c.ID] || c.EnvdAccessToken == parent.EnvdAccessToken || c.Metadata["from"] != "parent" || time.Until(c.EndAt) > 2*time.Minute {
			t.Errorf("child %d: %+v", i, c)
		}
		ids[c.ID] = true
		if _, p := count(t, e.mgr, c); p != pid {
			t.Errorf("child %d: pid %d, want the parent's %d", i, p, pid)
		}
		if out := run(t, e.mgr, c, "cat /home/user/file; hostname; echo $E2B_SANDBOX_ID"); out != fmt.Sprintf("parent\n%s\n%s\n", c.ID, c.ID) {
			t.Errorf("child %d sees %q", i, out)
		}
	}
	run(t, e.mgr, results[0].Sandbox, "echo child > /home/user/file")
	if out := run(t, e.mgr, results[1].Sandbox, "cat /home/user/file"); out != "parent\n" {
		t.Errorf("child 1 sees child 0's write: %q", out)
	}
	if out := run(t, e.mgr, parent, "cat /home/user/file"); out != "parent\n" {
		t.Errorf("the parent sees a child's write: %q", out)
	}
	entries, _ := filepath.Glob(e.mgr.cfg.Images.SnapshotDir(forkSnapshotPrefix + "*"))
	if len(entries) != 0 {
		t.Errorf("the fork's snapshot is left: %v", entries)
	}

	if _, err := e.mgr.Fork(ctx, team.MustParse("t1"), parent.ID, time.Minute, MaxForkCount+1); !errors.Is(err, ErrInvalid) {
		t.Errorf("a fork of %d: %v", MaxForkCount+1, err)
	}
	if _, err := e.mgr.Fork(ctx, team.MustParse("t2"), parent.ID, time.Minute, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team's fork: %v", err)
	}
	if _, err := e.mgr.Pause(ctx, team.MustParse("t1"), parent.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Snapshot(ctx, team.MustParse("t1"), parent.ID, filepath.Join(t.TempDir(), "s")); !errors.Is(err, ErrConflict) {
		t.Errorf("a snapshot of a paused sandbox: %v", err)
	}
}

// runc cannot checkpoint on this host: a pause with memory is refused
// with a reason, one without keeps the files.
func TestRuncPausesWithoutMemory(t *testing.T) {
	e := start(t, newStore(t), Config{})
	defer e.destroy()
	ctx := context.Background()
	rec, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if e.mgr.canCheckpoint() {
		t.Skip("runc can checkpoint on this host (CRIU ≥ 4.2)")
	}
	if _, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, true); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"memory": false`) {
		t.Errorf("pause with memory under runc: %v", err)
	}
	if _, err := e.create(CreateRequest{AutoPause: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("autoPause with memory under runc: %v", err)
	}
	no := false
	if _, err := e.create(CreateRequest{AutoPause: true, AutoPauseMemory: &no}); err != nil {
		t.Errorf("autoPause without memory under runc: %v", err)
	}
	run(t, e.mgr, rec, "echo kept > /home/user/file")
	if ok, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, false); !ok || err != nil {
		t.Fatalf("pause without memory: %v %v", ok, err)
	}
	if _, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, true); !resumed || err != nil {
		t.Fatalf("connect: %v %v", resumed, err)
	}
	if out := run(t, e.mgr, rec, "cat /home/user/file"); out != "kept\n" {
		t.Errorf("after resume: %q", out)
	}
}

// A real paused sandbox that resumes on traffic, on a node whose team
// limit is held in the store (a cluster's, Config.ReserveForTeam): while
// the team's place is taken elsewhere the traffic gets 429 and the
// sandbox stays paused, holding nothing; once the place is free the same
// traffic resumes it.
func TestTrafficResumeWaitsForAPlaceInTheTeamLimit(t *testing.T) {
	st := newStore(t)
	asked := 0
	e := startRunsc(t, st, Config{ReserveForTeam: storeClaims(st, 1, &asked)})
	defer e.destroy()
	ctx := context.Background()
	rec, err := e.create(CreateRequest{Timeout: time.Minute, AutoResume: true})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, true); !ok || err != nil {
		t.Fatalf("pause: %v %v", ok, err)
	}
	released(t, e.mgr, rec.ID)
	now := time.Now()
	other := store.Sandbox{ID: "on-another-node", TeamID: "t1", TemplateID: "base", State: store.StateRunning, Node: "other", StartedAt: now, EndAt: now.Add(time.Hour)}
	if err := st.CreateSandbox(ctx, other); err != nil {
		t.Fatal(err)
	}
	p := proxy.New(proxy.Config{Domain: "localhost", Resolver: e.mgr})
	if code, body := trafficTo(p, rec); code != http.StatusTooManyRequests || !strings.Contains(body, `"code":429`) {
		t.Fatalf("traffic at the team's limit: %d %s", code, body)
	}
	if got, _ := st.GetSandbox(ctx, rec.ID); got.State != store.StatePaused || got.Checkpoint == "" {
		t.Errorf("after the refusal: state %s checkpoint %q", got.State, got.Checkpoint)
	}
	if _, err := e.mgr.cfg.Node.Runtime().State(ctx, rec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("its container after the refusal: %v", err)
	}
	if _, err := st.UpdateSandbox(ctx, other.ID, func(s *store.Sandbox) error { s.State = store.StateKilled; return nil }); err != nil {
		t.Fatal(err)
	}
	if code, body := trafficTo(p, rec); code/100 != 2 {
		t.Fatalf("traffic once the place is free: %d %s", code, body)
	}
	if got, _ := st.GetSandbox(ctx, rec.ID); got.State != store.StateRunning || asked != 2 {
		t.Errorf("after the resume: state %s, the limit asked %d times, want running and 2", got.State, asked)
	}
}
