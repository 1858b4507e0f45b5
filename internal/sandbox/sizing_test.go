package sandbox

import (
	"math"
	"slices"
	"testing"
	"time"
)

// A steady rate converges to itself; without events it decays by e per
// time constant.
func TestEWMARateConvergesAndDecays(t *testing.T) {
	r := ewmaRate{tau: 10 * time.Second}
	now := time.Unix(1000, 0)
	for range 600 { // 5/s for 120 s
		now = now.Add(200 * time.Millisecond)
		r.add(now)
	}
	if got := r.rate(now); math.Abs(got-5) > 0.6 {
		t.Errorf("rate after 120 s at 5/s: %g, want about 5", got)
	}
	before := r.rate(now)
	if got := r.rate(now.Add(10 * time.Second)); math.Abs(got-before/math.E) > 1e-9 {
		t.Errorf("rate 10 s later: %g, want %g", got, before/math.E)
	}
	if got := (&ewmaRate{tau: time.Second}).rate(now); got != 0 {
		t.Errorf("rate without events: %g", got)
	}
}

// The demand rises with the fast rate and falls with the slow one.
func TestDemandRisesFastFallsSlowly(t *testing.T) {
	tn := defaultPoolTuning
	d := newDemand(tn)
	now := time.Unix(1000, 0)
	for range 5 { // one second at 5/s
		now = now.Add(200 * time.Millisecond)
		d.add(now)
	}
	if got := d.rate(now); got < 1 {
		t.Errorf("rate after a second at 5/s: %g, want the fast rate (≥ 1; the slow one is 0.08)", got)
	}
	for range 300 { // a minute more
		now = now.Add(200 * time.Millisecond)
		d.add(now)
	}
	later := now.Add(30 * time.Second)
	if fast, got := d.fast.rate(later), d.rate(later); fast > 0.01 || got < 1.5 {
		t.Errorf("30 s after the creates stopped: fast %g, demand %g; want the slow rate (≥ 1.5)", fast, got)
	}
	if got := d.rate(now.Add(10 * time.Minute)); got >= tn.minRate {
		t.Errorf("10 min after: %g, want under minRate %g", got, tn.minRate)
	}
}

func TestPoolTarget(t *testing.T) {
	tn := defaultPoolTuning // headroom 1 s
	start := 250 * time.Millisecond
	for _, c := range []struct {
		name           string
		rate           float64
		floor, ceiling int
		want           int
	}{
		{"no demand, no floor", 0, 0, 10, 0},
		{"no demand keeps the floor", 0, 2, 10, 2},
		{"below minRate counts as none", tn.minRate / 2, 0, 10, 0},
		{"one create a minute keeps one", 1.0 / 60, 0, 10, 1},
		{"5/s: 5 × (0.5 + 1) s", 5, 2, 20, 8},
		{"10/s: 15", 10, 2, 20, 15},
		{"bounded by the ceiling", 10, 2, 6, 6},
		{"the floor wins over the ceiling", 10, 4, 3, 4},
		{"a ceiling of 0 without floor", 5, 0, 0, 0},
	} {
		if got := poolTarget(c.rate, 0, start, tn, c.floor, c.ceiling); got != c.want {
			t.Errorf("%s: poolTarget(%g) = %d, want %d", c.name, c.rate, got, c.want)
		}
	}
	// Slower starts need more warm sandboxes for the same rate.
	if a, b := poolTarget(5, 0, 100*time.Millisecond, tn, 0, 100), poolTarget(5, 0, time.Second, tn, 0, 100); a >= b {
		t.Errorf("start 0.1 s: %d, start 1 s: %d; want more for the slower start", a, b)
	}
}

// A batch of creates keeps the pool at the batch's size for the next
// one, decaying like the slow rate; creates spread out are no batch.
func TestDemandRemembersBatches(t *testing.T) {
	tn := defaultPoolTuning
	d := newDemand(tn)
	now := time.Unix(1000, 0)
	for range 20 { // 20 creates within 40 ms
		now = now.Add(2 * time.Millisecond)
		d.add(now)
	}
	if got := d.batchSize(now); got != 20 {
		t.Errorf("right after a batch of 20: %d", got)
	}
	// Ten seconds later the rate alone keeps a few; the batch keeps 17.
	later := now.Add(10 * time.Second)
	rateOnly := poolTarget(d.rate(later), 0, 250*time.Millisecond, tn, 0, 100)
	if got := poolTarget(d.rate(later), d.batchSize(later), 250*time.Millisecond, tn, 0, 100); got != 17 || rateOnly >= 17 {
		t.Errorf("10 s after a batch of 20: target %d (the rate alone %d), want 17 (20·e^(-10/60), rounded)", got, rateOnly)
	}
	// A smaller batch later does not lower it; a larger one raises it.
	for range 5 {
		later = later.Add(time.Millisecond)
		d.add(later)
	}
	if got := d.batchSize(later); got != 17 {
		t.Errorf("after a batch of 5: %d, want the decayed 17", got)
	}
	for range 25 {
		later = later.Add(time.Millisecond)
		d.add(later) // the 5 above and these 25 are one batch of 30
	}
	if got := d.batchSize(later); got != 30 {
		t.Errorf("after a batch of 30: %d", got)
	}
	if got := d.batchSize(later.Add(5 * time.Minute)); got != 0 {
		t.Errorf("5 min later: %d, want none (30·e^-5 rounds to 0)", got)
	}
	// One create every two seconds is never a batch.
	spread := newDemand(tn)
	at := time.Unix(5000, 0)
	for range 30 {
		at = at.Add(2 * time.Second)
		spread.add(at)
	}
	if got := spread.batchSize(at); got != 0 {
		t.Errorf("creates 2 s apart: batch %d, want 0", got)
	}
}

// Warm sandboxes count against the budget at what they were measured to
// hold, their limit before that.
func TestFootprint(t *testing.T) {
	var f footprint
	if got := f.or(512); got != 512 {
		t.Errorf("unmeasured: %d", got)
	}
	f.add(20.2)
	if got := f.or(512); got != 21 {
		t.Errorf("20.2 MiB: %d, want 21", got)
	}
	f.add(70.2) // 20.2 + 50/5
	if got := f.or(512); got != 31 {
		t.Errorf("then 70.2 MiB: %d, want 31", got)
	}
	if got := (footprint{mean: 0.1}).or(512); got != 1 {
		t.Errorf("0.1 MiB: %d, want 1", got)
	}
}

func TestPoolCeiling(t *testing.T) {
	if got := poolCeiling(6000, 512, 100); got != 11 {
		t.Errorf("6000 MB of 512 MB sandboxes: %d, want 11", got)
	}
	if got := poolCeiling(6000, 512, 4); got != 4 {
		t.Errorf("bounded by max sandboxes: %d, want 4", got)
	}
	if got := poolCeiling(100, 512, 100); got != 0 {
		t.Errorf("a budget smaller than one sandbox: %d, want 0", got)
	}
}

func TestStartTimeMean(t *testing.T) {
	var s startTime
	if got := s.or(time.Second); got != time.Second {
		t.Errorf("unmeasured: %v", got)
	}
	s.add(100 * time.Millisecond)
	s.add(600 * time.Millisecond)
	if got := s.or(time.Second); got != 200*time.Millisecond {
		t.Errorf("100 ms then 600 ms: %v, want 200 ms (a fifth of the step)", got)
	}
}

func TestFairCeilings(t *testing.T) {
	for _, c := range []struct {
		name   string
		pools  []poolWant
		budget int
		want   []int
	}{
		{"all fit", []poolWant{{0, 3, 100}, {0, 2, 100}}, 1000, []int{3, 2}},
		{"a hot pool leaves the other its share",
			[]poolWant{{0, 50, 100}, {0, 4, 100}}, 1000, []int{6, 4}},
		{"two hot pools split it evenly",
			[]poolWant{{0, 50, 100}, {0, 50, 100}}, 1000, []int{5, 5}},
		{"a small claim is met in full, the rest goes to the big one",
			[]poolWant{{0, 1, 100}, {0, 50, 100}, {0, 50, 100}}, 1000, []int{1, 4, 5}}, // 900 MB left: 4 to one, the 500 after it to the other
		{"floors come first and count against the budget",
			[]poolWant{{2, 2, 100}, {0, 50, 100}}, 1000, []int{2, 8}},
		{"floors above the budget still hold, nothing more",
			[]poolWant{{4, 4, 300}, {0, 5, 100}}, 1000, []int{4, 0}},
		{"shares are in memory, not in sandboxes",
			[]poolWant{{0, 50, 400}, {0, 50, 100}}, 1000, []int{1, 5}},
		{"no demand, no ceiling above the floor", []poolWant{{1, 1, 100}, {0, 0, 100}}, 1000, []int{1, 0}},
		{"no pools", nil, 1000, []int{}},
	} {
		got := fairCeilings(c.pools, c.budget)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		used := 0
		for i, p := range c.pools {
			if got[i] > p.floor {
				used += got[i] * p.memoryMB
			} else {
				used += p.floor * p.memoryMB
			}
		}
		if floors := sumFloors(c.pools); used > max(c.budget, floors) {
			t.Errorf("%s: the ceilings hold %d MB of a %d MB budget", c.name, used, c.budget)
		}
	}
}

func sumFloors(ps []poolWant) int {
	n := 0
	for _, p := range ps {
		n += p.floor * p.memoryMB
	}
	return n
}
