package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/team"
)

// testTuning is the sizing policy on a test's time scale: seconds, not
// minutes.
var testTuning = poolTuning{
	fastWindow: 2 * time.Second, slowWindow: 4 * time.Second, headroom: time.Second,
	minRate: 0.2, parallel: 3, tick: 50 * time.Millisecond, shrinkEvery: 200 * time.Millisecond,
	idleAfter: 2 * time.Second, defaultStart: 300 * time.Millisecond,
}

// poolState is a pool's target, ready and in-flight warm sandboxes; ok
// false when the template has no pool.
func (e *env) poolState(templateID string) (target, ready, building int, ok bool) {
	e.mgr.mu.Lock()
	defer e.mgr.mu.Unlock()
	p := e.mgr.pools[templateID]
	if p == nil {
		return 0, 0, 0, false
	}
	return p.target, len(p.ready), p.building, true
}

// holding reports every sandbox as holding mb MiB, so that a pool's
// budget is counted in whole sandboxes of that size.
type holding struct {
	runtime.Runtime
	mb uint64
}

func (h holding) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	st, err := h.Runtime.Stats(ctx, id)
	st.MemoryBytes = h.mb << 20
	return st, err
}

func holdingMB(mb uint64) func(runtime.Runtime) runtime.Runtime {
	return func(rt runtime.Runtime) runtime.Runtime { return holding{Runtime: rt, mb: mb} }
}

// A burst of creates grows the base pool above its floor (within the
// memory budget), and once the creates stop it shrinks back to the floor.
func TestWarmPoolGrowsWithBurstAndShrinksWhenIdle(t *testing.T) {
	const budget = 5 // sandboxes holding 256 MB
	e := startWith(t, newStore(t), Config{PoolSize: 1, PoolMaxMemoryMB: budget * 256}, envOptions{tuning: &testTuning, wrap: holdingMB(256)})
	defer e.destroy()
	e.waitWarm(1)

	var mu sync.Mutex
	maxTarget, maxCount := 0, 0
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() { // samples the pool while the burst runs
		defer close(watched)
		for {
			target, ready, building, _ := e.poolState(baseimage.TemplateID)
			mu.Lock()
			maxTarget, maxCount = max(maxTarget, target), max(maxCount, ready+building)
			mu.Unlock()
			select {
			case <-stopWatch:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()

	// 16 creates at 8/s, each killed right after.
	var kills sync.WaitGroup
	tick := time.NewTicker(125 * time.Millisecond)
	for i := range 16 {
		<-tick.C
		rec, err := e.create(CreateRequest{})
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		kills.Add(1)
		go func() {
			defer kills.Done()
			if err := e.mgr.Kill(context.Background(), team.MustParse("t1"), rec.ID); err != nil {
				t.Errorf("kill %s: %v", rec.ID, err)
			}
		}()
	}
	tick.Stop()
	kills.Wait()
	close(stopWatch)
	<-watched
	if maxTarget < 4 || maxCount < 4 {
		t.Errorf("during 8 creates/s the pool's target reached %d and it held at most %d warm sandboxes; want ≥ 4 (floor 1)", maxTarget, maxCount)
	}
	if maxCount > budget {
		t.Errorf("the pool held %d warm sandboxes, over its memory budget of %d", maxCount, budget)
	}

	// Idle: back to the floor.
	var target, ready, building int
	if !poll.Within(30*time.Second, 50*time.Millisecond, func() bool {
		target, ready, building, _ = e.poolState(baseimage.TemplateID)
		return target == 1 && ready == 1 && building == 0
	}) {
		t.Errorf("idle for 30 s, the pool is at target %d with %d ready and %d starting; want 1, 1, 0", target, ready, building)
	}
	e.mgr.mu.Lock()
	u := e.mgr.usedLocked()
	e.mgr.mu.Unlock()
	if u.sandboxes != 1 || u.memoryMB != 256 {
		t.Errorf("after the shrink the node holds %+v, want the one warm sandbox", u)
	}
}

// A template other than the configured ones gets a pool once created
// from: its next create claims a warm sandbox of it, and when its creates
// stop the pool empties and is removed.
func TestWarmPoolForAnotherTemplateIsMadeAndReaped(t *testing.T) {
	const otherID = "wstpoolother"
	var e *env
	resolve := func(_ context.Context, _, ref string) (Template, error) {
		base, err := e.mgr.cfg.Images.Template(baseimage.TemplateID)
		if err != nil {
			return Template{}, err
		}
		if ref == "other" {
			base.ID = otherID // the base image under another template's ID
		}
		return Template{ID: base.ID, Alias: ref, Image: base}, nil
	}
	e = startWith(t, newStore(t), Config{PoolSize: 1, Resolve: resolve}, envOptions{tuning: &testTuning})
	defer e.destroy()
	e.waitWarm(1)

	first, err := e.create(CreateRequest{TemplateID: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, ok := e.poolState(otherID); !ok {
		t.Fatal("no pool for the template after its first create")
	}
	if !poll.Within(30*time.Second, 20*time.Millisecond, func() bool { _, ready, _, _ := e.poolState(otherID); return ready == 1 }) {
		t.Fatal("the new pool did not get a warm sandbox within 30 s")
	}
	e.mgr.mu.Lock()
	p := e.mgr.pools[otherID]
	e.mgr.mu.Unlock()
	w := <-p.ready
	p.ready <- w // peek
	second, err := e.create(CreateRequest{TemplateID: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != w.inst.ID || second.TemplateID != otherID {
		t.Errorf("the second create is %s of %s, want the warm %s of %s", second.ID, second.TemplateID, w.inst.ID, otherID)
	}
	for _, id := range []string{first.ID, second.ID} {
		if err := e.mgr.Kill(context.Background(), team.MustParse("t1"), id); err != nil {
			t.Error(err)
		}
	}
	if !poll.Within(40*time.Second, 50*time.Millisecond, func() bool { _, _, _, ok := e.poolState(otherID); return !ok }) {
		target, ready, building, _ := e.poolState(otherID)
		t.Fatalf("the unused pool was not removed within 40 s: target %d, %d ready, %d starting", target, ready, building)
	}
	if live, warm := e.mgr.Count(); live != 0 || warm != 1 {
		t.Errorf("after the reap: %d live, %d warm; want 0 and base's one", live, warm)
	}
	if _, _, _, ok := e.poolState(baseimage.TemplateID); !ok {
		t.Error("the base pool, which has a floor, was removed")
	}
}

// On a node that is full with warm sandboxes of one template, a create of
// another template evicts one instead of getting 503.
func TestWarmSandboxesAreEvictedForAColdCreate(t *testing.T) {
	var e *env
	resolve := func(_ context.Context, _, ref string) (Template, error) {
		base, err := e.mgr.cfg.Images.Template(baseimage.TemplateID)
		if err != nil {
			return Template{}, err
		}
		if ref == "other" {
			base.ID = "wstpoolevict"
		}
		return Template{ID: base.ID, Alias: ref, Image: base}, nil
	}
	// Room for one 256 MB sandbox, held by base's warm one.
	e = startWith(t, newStore(t), Config{PoolSize: 1, NodeCPUs: 64, NodeMemoryMB: 300, MemoryOvercommit: 1, Resolve: resolve},
		envOptions{tuning: &testTuning})
	defer e.destroy()
	e.waitWarm(1)
	rec, err := e.create(CreateRequest{TemplateID: "other"})
	if err != nil {
		t.Fatalf("a create of another template on a node full of warm sandboxes: %v", err)
	}
	if rec.TemplateID != "wstpoolevict" {
		t.Errorf("created from %s", rec.TemplateID)
	}
	e.mgr.mu.Lock()
	u := e.mgr.usedLocked()
	e.mgr.mu.Unlock()
	if u.memoryMB > 300 {
		t.Errorf("the node holds %+v, over its 300 MB", u)
	}
	// Still full: a third sandbox is refused, with no warm one to evict.
	if _, err := e.create(CreateRequest{TemplateID: "other"}); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("a create on a node full of live sandboxes: %v, want ErrNoCapacity", err)
	}
}

// When its template is removed, a pool's warm sandboxes are discarded at
// once and the pool goes, while the floor of the base pool stays.
func TestForgetTemplateEmptiesItsPool(t *testing.T) {
	const otherID = "wstpoolgone"
	var e *env
	resolve := func(_ context.Context, _, ref string) (Template, error) {
		base, err := e.mgr.cfg.Images.Template(baseimage.TemplateID)
		if err != nil {
			return Template{}, err
		}
		base.ID = otherID
		return Template{ID: base.ID, Alias: ref, Image: base}, nil
	}
	tuning := testTuning
	tuning.idleAfter = time.Hour // only the forgetting may remove it
	e = startWith(t, newStore(t), Config{PoolSize: 1, Resolve: resolve}, envOptions{tuning: &tuning})
	defer e.destroy()
	e.waitWarm(1)
	rec, err := e.create(CreateRequest{TemplateID: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if !poll.Within(30*time.Second, 20*time.Millisecond, func() bool { _, ready, _, _ := e.poolState(otherID); return ready >= 1 }) {
		t.Fatal("the template's pool got no warm sandbox within 30 s")
	}
	e.mgr.ForgetTemplate(otherID)
	if !poll.Within(30*time.Second, 20*time.Millisecond, func() bool { _, _, _, ok := e.poolState(otherID); return !ok }) {
		target, ready, building, _ := e.poolState(otherID)
		t.Fatalf("the forgotten template's pool is still there: target %d, %d ready, %d starting", target, ready, building)
	}
	if live, warm := e.mgr.Count(); live != 1 || warm != 1 {
		t.Errorf("after forgetting: %d live, %d warm; want the created one and base's warm one", live, warm)
	}
	if err := e.mgr.Kill(context.Background(), team.MustParse("t1"), rec.ID); err != nil {
		t.Error(err)
	}
	e.mgr.ForgetTemplate("never-had-a-pool") // a no-op
}

// One busy template cannot keep the whole pool budget: once another
// template is as busy, each pool holds its share.
func TestPoolsShareTheBudgetFairly(t *testing.T) {
	e := startWith(t, newStore(t), Config{PoolSize: 1, PoolMaxMemoryMB: 3 * 256}, envOptions{tuning: &testTuning, wrap: holdingMB(256)})
	defer e.destroy()
	e.waitWarm(1) // base's floor: 256 of the 768 MB, 512 left for the others
	base, err := e.mgr.cfg.Images.Template(baseimage.TemplateID)
	if err != nil {
		t.Fatal(err)
	}
	res := e.mgr.cfg.Resources
	// heat counts creates of a template (as claims do) without making
	// sandboxes: the demand is what is shared, not the node.
	// (a claim, which adds the pool, only while it has none: claims would
	// take its warm sandboxes).
	heat := func(id string, n int) {
		if _, _, _, ok := e.poolState(id); !ok {
			img := *base
			img.ID = id
			if w := e.mgr.claimWarm(&img, res); w != nil {
				e.mgr.discard(w.inst)
			}
		}
		e.mgr.mu.Lock()
		for range n {
			e.mgr.pools[id].demand.add(time.Now())
		}
		e.mgr.mu.Unlock()
	}
	count := func(id string) int {
		_, ready, building, _ := e.poolState(id)
		return ready + building
	}
	if !poll.Within(30*time.Second, 100*time.Millisecond, func() bool { heat("wstfaira", 10); return count("wstfaira") == 2 }) {
		t.Fatalf("the busy pool holds %d warm sandboxes, want the 2 the budget has room for", count("wstfaira"))
	}
	if !poll.Within(30*time.Second, 100*time.Millisecond, func() bool {
		heat("wstfaira", 10)
		heat("wstfairb", 10)
		_, ready, _, _ := e.poolState("wstfairb")
		return ready == 1 && count("wstfaira") == 1
	}) {
		t.Fatalf("with two busy templates their pools hold %d and %d, want 1 each", count("wstfaira"), count("wstfairb"))
	}
	e.mgr.mu.Lock()
	pooled := e.mgr.pooledMemoryLocked()
	e.mgr.mu.Unlock()
	if pooled > 3*256 {
		t.Errorf("the pools hold %d MB, over the 768 MB budget", pooled)
	}
}

// The budget counts a warm sandbox at what it holds once started, not its
// limit: a budget of two sandboxes' limits holds many idle ones. And a
// batch of creates keeps the pool at the batch's size after it.
func TestPoolBudgetCountsWhatWarmSandboxesHoldAndBatchesStay(t *testing.T) {
	tuning := testTuning
	tuning.batchWindow = time.Second
	tuning.slowWindow = 10 * time.Minute // the batch is remembered throughout
	tuning.minRate = 100                 // the rate alone keeps nothing: what grows the pool is the batch
	// The test's sandboxes are limited to 256 MB (startWith).
	e := startWith(t, newStore(t), Config{PoolSize: 1, PoolMaxMemoryMB: 2 * 256}, envOptions{tuning: &tuning})
	defer e.destroy()
	e.waitWarm(1)
	e.mgr.mu.Lock()
	held := e.mgr.pools[baseimage.TemplateID].heldMB()
	e.mgr.mu.Unlock()
	if held <= 0 || held >= 256 {
		t.Fatalf("a warm sandbox was measured at %d MB, want more than 0 and less than its 256 MB limit", held)
	}
	const batch = 5
	if batch*held > 2*256 {
		t.Fatalf("an idle sandbox holds %d MB: %d of them exceed the budget of two limits", held, batch)
	}
	// A batch of 5 creates at once.
	var wg sync.WaitGroup
	for range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, err := e.create(CreateRequest{})
			if err != nil {
				t.Error(err)
				return
			}
			if err := e.mgr.Kill(context.Background(), team.MustParse("t1"), rec.ID); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var target, ready, building int
	if !poll.Within(30*time.Second, 50*time.Millisecond, func() bool {
		target, ready, building, _ = e.poolState(baseimage.TemplateID)
		return ready == batch
	}) {
		t.Fatalf("after a batch of %d the pool is at target %d with %d ready, %d starting; want %d ready", batch, target, ready, building, batch)
	}
	e.mgr.mu.Lock()
	pooled := e.mgr.pooledMemoryLocked()
	e.mgr.mu.Unlock()
	if pooled > 2*256 {
		t.Errorf("the pool holds %d MB by its measure, over the budget of 512", pooled)
	}
}
