package sandbox

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/team"
)

// snapTuning keeps one warm sandbox for a template created from once in
// a while, and never more: the rates' windows are long (a create counts
// for minutes), so that runsc restores on a loaded machine neither lose
// the pool nor start several at once.
var snapTuning = func() poolTuning {
	t := testTuning
	t.fastWindow, t.slowWindow, t.minRate = 10*time.Minute, 10*time.Minute, 0.001
	t.idleAfter, t.parallel = time.Hour, 1
	return t
}()

// snapshotImage runs script in a new sandbox of base, snapshots it as
// the image of template id (a running sandbox's snapshot used as a
// template, with its disk), and kills the sandbox. It returns the image
// and the pid the script's counter loop had.
func (e *env) snapshotImage(id, script string) (image.Template, int) {
	t := e.t
	t.Helper()
	ctx := context.Background()
	rec, err := e.create(CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	run(t, e.mgr, rec, script)
	_, pid := count(t, e.mgr, rec)
	snapID := "wst-" + NewID()
	snap, err := e.mgr.Snapshot(ctx, team.MustParse("t1"), rec.ID, e.mgr.cfg.Images.SnapshotDir(snapID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.mgr.cfg.Images.RemoveSnapshot(snapID); err != nil && !os.IsNotExist(err) {
			t.Error(err)
		}
	})
	if err := e.mgr.Kill(ctx, team.MustParse("t1"), rec.ID); err != nil {
		t.Fatal(err)
	}
	img := snap.Image
	img.ID, img.Snapshot = id, snapID
	return img, pid
}

// readyWarm waits for a ready warm sandbox of the template's pool and
// returns it, left in the pool.
func (e *env) readyWarm(templateID string) *warm {
	e.t.Helper()
	var w *warm
	if !poll.Within(90*time.Second, 20*time.Millisecond, func() bool {
		e.mgr.mu.Lock()
		defer e.mgr.mu.Unlock()
		p := e.mgr.pools[templateID]
		if p == nil || len(p.ready) == 0 {
			return false
		}
		w = <-p.ready
		p.ready <- w // peek
		return true
	}) {
		target, ready, building, ok := e.poolState(templateID)
		e.t.Fatalf("no warm sandbox of %s within 90 s (pool %v: target %d, %d ready, %d starting)", templateID, ok, target, ready, building)
	}
	return w
}

// containers are the IDs of the runtime's containers.
func (e *env) containers() map[string]bool {
	cs, err := e.mgr.cfg.Node.Runtime().List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, c := range cs {
		out[c.ID] = true
	}
	return out
}

// A template that starts from a snapshot gets a warm pool of sandboxes
// restored from it: a create claims one, with the snapshot's processes
// running and the create's identity, environment and token; once the
// template is rebuilt (a new snapshot) the old warm sandboxes are never
// handed out; a fork of one of its sandboxes restores cold and leaves the
// pool alone; Close removes the warm ones.
func TestWarmPoolRestoresSnapshotTemplates(t *testing.T) {
	const tmplID = "wstsnappool"
	var mu sync.Mutex
	var current *image.Template // what the template resolves to now
	var e *env
	resolve := func(_ context.Context, _, ref string) (Template, error) {
		if ref == baseimage.TemplateID {
			base, err := e.mgr.cfg.Images.Template(baseimage.TemplateID)
			return Template{ID: base.ID, Alias: ref, Image: base}, err
		}
		mu.Lock()
		img := *current
		mu.Unlock()
		return Template{ID: img.ID, Alias: ref, Image: &img}, nil
	}
	e = startWith(t, newStore(t), Config{PoolSize: 1, PoolTemplates: []string{}, PoolMaxMemoryMB: 4096, Resolve: resolve},
		envOptions{runtime: "runsc", tuning: &snapTuning})
	defer e.destroy()
	ctx := context.Background()

	// The "start command": a counter in a process's memory, and a file.
	img1, pid := e.snapshotImage(tmplID, counterLoop+"; echo gen1 > /home/user/gen")
	e.mgr.ForgetTemplate(baseimage.TemplateID) // its parents' pool is not under test
	mu.Lock()
	current = &img1
	mu.Unlock()

	// The first create restores cold and makes the pool, which restores
	// one ahead of the next.
	first, err := e.create(CreateRequest{TemplateID: "snap"})
	if err != nil {
		t.Fatal(err)
	}
	w := e.readyWarm(tmplID)
	if w.snapshot != img1.Snapshot || w.token != img1.SnapshotToken {
		t.Errorf("the warm sandbox is of snapshot %q with token %q; want %q with the snapshot's", w.snapshot, w.token, img1.Snapshot)
	}
	second, err := e.create(CreateRequest{TemplateID: "snap", EnvVars: map[string]string{"FOO": "bar"}})
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != w.inst.ID {
		t.Fatalf("the second create is %s, not the warm %s: the claim was not taken", second.ID, w.inst.ID)
	}
	if second.TemplateID != tmplID || second.EnvdAccessToken == img1.SnapshotToken {
		t.Errorf("the claimed sandbox's record: template %s, token is the snapshot's: %v", second.TemplateID, second.EnvdAccessToken == img1.SnapshotToken)
	}
	// The start command's state: the snapshotted process, counting on.
	if n, p := countPast(t, e.mgr, second, 0); p != pid || n == 0 {
		t.Errorf("the warm sandbox's counter: %d in pid %d; want the snapshot's process %d counting", n, p, pid)
	}
	if out := run(t, e.mgr, second, "cat /home/user/gen; hostname; echo $FOO $E2B_SANDBOX_ID"); out != fmt.Sprintf("gen1\n%s\nbar %s\n", second.ID, second.ID) {
		t.Errorf("the warm sandbox sees %q", out)
	}
	status, body := envdEnv(t, e.mgr, second)
	if status != http.StatusOK || !strings.Contains(body, `"FOO":"bar"`) || !strings.Contains(body, `"E2B_SANDBOX_ID":"`+second.ID+`"`) {
		t.Errorf("envd /envs with the create's token: %d %s", status, body)
	}
	stale := second
	stale.EnvdAccessToken = img1.SnapshotToken
	if status, _ := envdEnv(t, e.mgr, stale); status != http.StatusUnauthorized {
		t.Errorf("the snapshot's token still opens the claimed sandbox's envd: %d", status)
	}

	// A fork of a sandbox of the template restores its own snapshot
	// cold: the template's warm sandbox stays in the pool.
	w = e.readyWarm(tmplID)
	forks, err := e.mgr.Fork(ctx, team.MustParse("t1"), second.ID, time.Minute, 1)
	if err != nil || forks[0].Err != nil {
		t.Fatalf("fork: %v %v", err, forks)
	}
	if forks[0].Sandbox.ID == w.inst.ID {
		t.Errorf("the fork took the template's warm sandbox %s", w.inst.ID)
	}
	if again := e.readyWarm(tmplID); again != w {
		t.Errorf("after the fork the pool holds %s, not its warm %s", again.inst.ID, w.inst.ID)
	}
	for _, id := range []string{first.ID, second.ID, forks[0].Sandbox.ID} {
		if err := e.mgr.Kill(ctx, team.MustParse("t1"), id); err != nil {
			t.Error(err)
		}
	}

	// The template is rebuilt: a new snapshot under the same ID. The warm
	// sandbox of the old one is discarded, never handed out.
	img2, pid2 := e.snapshotImage(tmplID, counterLoop+"; echo gen2 > /home/user/gen")
	e.mgr.ForgetTemplate(baseimage.TemplateID)
	old := e.readyWarm(tmplID)
	if old.snapshot != img1.Snapshot {
		t.Fatalf("the pool's warm sandbox is of %q, want the old snapshot %q", old.snapshot, img1.Snapshot)
	}
	mu.Lock()
	current = &img2
	mu.Unlock()
	third, err := e.create(CreateRequest{TemplateID: "snap"})
	if err != nil {
		t.Fatal(err)
	}
	if third.ID == old.inst.ID {
		t.Fatalf("the rebuilt template's create got the old snapshot's warm sandbox %s", old.inst.ID)
	}
	if out := run(t, e.mgr, third, "cat /home/user/gen"); out != "gen2\n" {
		t.Errorf("the rebuilt template's sandbox sees %q, want gen2", out)
	}
	if _, p := count(t, e.mgr, third); p != pid2 {
		t.Errorf("the rebuilt template's sandbox runs pid %d, want the new snapshot's %d", p, pid2)
	}
	if e.containers()[old.inst.ID] {
		t.Errorf("the old snapshot's warm sandbox %s still runs", old.inst.ID)
	}
	// And the pool refills from the new snapshot, which a create claims.
	w = e.readyWarm(tmplID)
	if w.snapshot != img2.Snapshot {
		t.Errorf("the refilled warm sandbox is of %q, want %q", w.snapshot, img2.Snapshot)
	}
	fourth, err := e.create(CreateRequest{TemplateID: "snap"})
	if err != nil {
		t.Fatal(err)
	}
	if fourth.ID != w.inst.ID {
		t.Errorf("the create after the rebuild is %s, not the warm %s", fourth.ID, w.inst.ID)
	}
	if out := run(t, e.mgr, fourth, "cat /home/user/gen"); out != "gen2\n" {
		t.Errorf("the claimed sandbox of the rebuilt template sees %q", out)
	}
	for _, id := range []string{third.ID, fourth.ID} {
		if err := e.mgr.Kill(ctx, team.MustParse("t1"), id); err != nil {
			t.Error(err)
		}
	}

	// Close removes the warm restored sandboxes: no container, and no
	// slot beyond the network's own pool.
	w = e.readyWarm(tmplID)
	if err := e.mgr.Close(); err != nil {
		t.Fatal(err)
	}
	if e.containers()[w.inst.ID] {
		t.Errorf("after Close the warm sandbox %s still runs", w.inst.ID)
	}
	if left := e.containers(); len(left) != 0 {
		t.Errorf("after Close the runtime still has %v", left)
	}
}

// Only creates and templates without volumes take warm sandboxes.
func TestStartsWarm(t *testing.T) {
	booted := &image.Template{Layers: []string{"l"}}
	built := &image.Template{Layers: []string{"l"}, Snapshot: "snap-x", SnapshotToken: "t"}
	sandboxSnap := &image.Template{Layers: []string{"l"}, Snapshot: "snapdir-x", SnapshotToken: "t", SnapshotDisk: true}
	withVolumes := &image.Template{Layers: []string{"l"}, Snapshot: "snapdir-y", SnapshotToken: "t", SnapshotDisk: true,
		SnapshotMounts: []image.VolumeMount{{VolumeID: "v", Name: "data", Path: "/data"}}}
	for _, c := range []struct {
		name   string
		tmpl   *image.Template
		mounts int
		want   bool
	}{
		{"booted", booted, 0, true},
		{"build snapshot", built, 0, true},
		{"sandbox snapshot", sandboxSnap, 0, true},
		{"create with volumes", booted, 1, false},
		{"snapshot create with volumes", built, 1, false},
		{"snapshot with volumes", withVolumes, 0, false},
	} {
		if got := startsWarm(c.tmpl, c.mounts); got != c.want {
			t.Errorf("%s: startsWarm %v, want %v", c.name, got, c.want)
		}
	}
}
