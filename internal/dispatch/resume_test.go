package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// A sandbox paused into the blob store outlives its node: once the node
// is lost, it is listed, and a resume or connect goes to a live node. One
// paused only on its node stays gone with it; another team finds
// neither.
func TestPausedInTheBlobStoreResumesElsewhere(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	d := c.d
	mk := func(id, blob string) {
		rec := store.Sandbox{ID: id, TeamID: "t1", TemplateID: "base", State: store.StatePaused, Node: "nb",
			PausedAt: c.now, PausedBlob: blob, StartedAt: c.now, EndAt: c.now.Add(time.Hour)}
		if err := c.st.CreateSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	mk("stored", "sha256:"+strings.Repeat("ab", 32))
	mk("local", "")
	if _, err := c.st.HeartbeatNode(ctx, "na", c.now.Add(cluster.DefaultLostAfter), store.NodeUsage{}); err != nil {
		t.Fatal(err)
	}
	c.later(cluster.DefaultLostAfter + time.Second) // nb is lost

	if _, err := d.Get(ctx, team.MustParse("t1"), "stored"); err != nil {
		t.Fatalf("get of a sandbox in the blob store, its node lost: %v", err)
	}
	if _, err := d.Get(ctx, team.MustParse("t1"), "local"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get of a sandbox on its lost node only: %v", err)
	}
	if recs, _ := d.List(ctx, team.MustParse("t1"), store.SandboxFilter{}); len(recs) != 1 || recs[0].ID != "stored" {
		t.Fatalf("list: %+v", recs)
	}
	for _, tm := range []team.ID{team.MustParse("t2"), {}} {
		if _, err := d.Get(ctx, tm, "stored"); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("get as team %q: %v", tm, err)
		}
		if _, err := d.ResumeSandbox(ctx, tm, "stored", sandbox.ResumeOptions{Timeout: time.Minute}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("resume as team %q: %v", tm, err)
		}
	}
	if _, err := d.ResumeSandbox(ctx, team.MustParse("t1"), "local", sandbox.ResumeOptions{Timeout: time.Minute}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("resume of a sandbox on its lost node only: %v", err)
	}

	// na is full first: the resume says so, and goes nowhere else (nb is lost).
	c.nodes["na"].set(fmt.Errorf("%w: node na is full", sandbox.ErrNoCapacity))
	if _, err := d.ResumeSandbox(ctx, team.MustParse("t1"), "stored", sandbox.ResumeOptions{Timeout: time.Minute}); !errors.Is(err, sandbox.ErrNoCapacity) {
		t.Fatalf("resume with the only live node full: %v", err)
	}
	c.nodes["na"].set(nil)
	if _, resumed, err := d.Connect(ctx, team.MustParse("t1"), "stored", time.Minute, true); err != nil || !resumed {
		t.Fatalf("connect: %v %v", resumed, err)
	}
	if got := c.nodes["na"].asked; len(got) != 2 || got[1] != "connect t1 stored" {
		t.Fatalf("na was asked %v", got)
	}
	if got := c.nodes["nb"].asked; len(got) != 0 {
		t.Fatalf("the lost node was asked %v", got)
	}

	// Back on its own node (live again), full: another node takes it.
	if _, err := c.st.UpdateSandbox(ctx, "stored", func(s *store.Sandbox) error {
		s.State, s.Node = store.StatePaused, "nb"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"na", "nb"} {
		if _, err := c.st.HeartbeatNode(ctx, n, c.now.Add(time.Second), store.NodeUsage{}); err != nil {
			t.Fatal(err)
		}
	}
	c.later(2 * time.Second)
	c.nodes["nb"].set(fmt.Errorf("%w: node nb is full", sandbox.ErrNoCapacity))
	if _, err := d.ResumeSandbox(ctx, team.MustParse("t1"), "stored", sandbox.ResumeOptions{Timeout: time.Minute}); err != nil {
		t.Fatalf("resume with its own node full: %v", err)
	}
	if got := c.nodes["na"].asked; len(got) != 3 || got[2] != "resume t1 stored" {
		t.Fatalf("na was asked %v", got)
	}
	if got := c.nodes["nb"].asked; len(got) != 1 || got[0] != "resume t1 stored" {
		t.Fatalf("nb was asked %v", got)
	}

	// Its node drained: another node takes it, the drained one is not asked.
	if _, err := c.st.UpdateSandbox(ctx, "stored", func(s *store.Sandbox) error {
		s.State, s.Node = store.StatePaused, "nb"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.nodes["nb"].set(nil)
	if err := c.st.SetNodeState(ctx, "nb", store.NodeDraining); err != nil {
		t.Fatal(err)
	}
	c.later(time.Second)
	if _, _, err := d.Connect(ctx, team.MustParse("t1"), "stored", time.Minute, true); err != nil {
		t.Fatalf("connect with its node drained: %v", err)
	}
	if got := c.nodes["na"].asked; len(got) != 4 || got[3] != "connect t1 stored" {
		t.Fatalf("na was asked %v", got)
	}
	if got := c.nodes["nb"].asked; len(got) != 1 {
		t.Fatalf("the drained node was asked %v", got)
	}
}

// A kill of a sandbox paused into the blob store by a lost node goes to
// a live node (which removes it from the stores); one paused on its lost
// node only, or another team's, is not found and no node is asked.
func TestKillOfPausedInTheBlobStoreGoesElsewhere(t *testing.T) {
	ctx := context.Background()
	c := newCluster2(t)
	d := c.d
	for id, blob := range map[string]string{"stored": "sha256:" + strings.Repeat("cd", 32), "local": ""} {
		rec := store.Sandbox{ID: id, TeamID: "t1", TemplateID: "base", State: store.StatePaused, Node: "nb",
			PausedAt: c.now, PausedBlob: blob, StartedAt: c.now, EndAt: c.now.Add(time.Hour)}
		if err := c.st.CreateSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.st.HeartbeatNode(ctx, "na", c.now.Add(cluster.DefaultLostAfter), store.NodeUsage{}); err != nil {
		t.Fatal(err)
	}
	c.later(cluster.DefaultLostAfter + time.Second) // nb is lost
	for _, tm := range []team.ID{team.MustParse("t2"), {}} {
		if err := d.Kill(ctx, tm, "stored"); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("kill as team %q: %v", tm, err)
		}
	}
	if err := d.Kill(ctx, team.MustParse("t1"), "local"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("kill of a sandbox on its lost node only: %v", err)
	}
	if got := c.nodes["na"].asked; len(got) != 0 {
		t.Fatalf("na was asked %v", got)
	}
	if err := d.Kill(ctx, team.MustParse("t1"), "stored"); err != nil {
		t.Fatalf("kill of a sandbox in the blob store, its node lost: %v", err)
	}
	if got := c.nodes["na"].asked; len(got) != 1 || got[0] != "kill t1 stored" {
		t.Fatalf("na was asked %v", got)
	}
	if got := c.nodes["nb"].asked; len(got) != 0 {
		t.Fatalf("the lost node was asked %v", got)
	}
}
