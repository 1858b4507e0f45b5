package sandbox

import (
	"math"
	"slices"
	"time"
)

// Pool sizing. A template's warm pool is kept at the number of sandboxes
// its creates will claim while new ones start: the recent create rate
// times the time a warm sandbox takes to start (twice that: a start under
// load takes longer than the average says), plus a second of demand as
// headroom for bursts. Between that and what is already warm or warming,
// the pool starts more, up to poolTuning.parallel at once.
//
// The rate is the larger of two exponentially weighted rates: a fast one
// (a few seconds) so that a burst grows the pool within a second or two,
// and a slow one (a minute) so that it shrinks only once the demand has
// been gone for a while. A rate below minRate counts as none: a template
// used once in a while gets no warm sandbox kept for it.
//
// A rate forgets the shape of the demand: twenty creates at once every
// ten seconds is 2/s, which keeps four warm, and sixteen of each batch
// would boot cold. So the pool is also kept at least at its largest
// recent batch (the most creates within batchWindow of the first),
// which decays like the slow rate: a client that creates sandboxes in
// batches finds the next batch warm.
//
// Bounds: the floor (--pool-size for the configured templates, 0 for the
// others) is kept even without demand; the ceiling is what the pool
// memory budget (--pool-max-memory-mb) holds of the template's warm
// sandboxes, each counted at the memory they were measured to hold once
// started (an idle sandbox holds a few tens of MiB of its limit; its
// limit until one was measured), and --max-sandboxes. When several pools
// want more of the budget than it holds, each gets a fair share of it
// (fairCeilings): a pool above its share shrinks, one below it may grow.
// Every warm start is admitted like a create, at its limits, so the
// node's capacity bounds the pools too (fitsLocked).

// poolTuning are the sizing policy's constants; tests shorten them.
type poolTuning struct {
	fastWindow, slowWindow time.Duration // time constants of the two rates
	headroom               time.Duration // demand kept ready beyond the starts in flight
	minRate                float64       // creates/s below which the demand counts as none
	parallel               int           // warm starts in flight per pool
	tick                   time.Duration // how often a pool re-sizes without a claim
	shrinkEvery            time.Duration // one surplus warm sandbox is removed per interval
	idleAfter              time.Duration // a pool without floor, demand and sandboxes this long is removed
	defaultStart           time.Duration // start time assumed before one was measured
	batchWindow            time.Duration // creates this close to a batch's first are one batch
}

var defaultPoolTuning = poolTuning{
	fastWindow:   3 * time.Second,
	slowWindow:   time.Minute,
	headroom:     time.Second,
	minRate:      1.0 / 300, // one create in five minutes
	parallel:     3,
	tick:         time.Second,
	shrinkEvery:  5 * time.Second,
	idleAfter:    10 * time.Minute,
	defaultStart: 500 * time.Millisecond,
	batchWindow:  time.Second,
}

// maxPools bounds the pools of templates not configured with a floor:
// each has a goroutine and the memory budget is shared by all.
const maxPools = 32

// ewmaRate is an event rate (per second), exponentially weighted with time
// constant tau: each event adds 1/tau, and the sum decays by e^(-t/tau).
// A steady rate r converges to r.
type ewmaRate struct {
	tau   time.Duration
	value float64
	at    time.Time
}

// add counts one event at now.
func (r *ewmaRate) add(now time.Time) {
	r.value = r.rate(now) + 1/r.tau.Seconds()
	r.at = now
}

// rate is the weighted rate at now.
func (r *ewmaRate) rate(now time.Time) float64 {
	if r.value == 0 {
		return 0
	}
	dt := now.Sub(r.at).Seconds()
	if dt <= 0 {
		return r.value
	}
	return r.value * math.Exp(-dt/r.tau.Seconds())
}

// demand is a template's recent creates.
type demand struct {
	fast, slow ewmaRate
	// The batch under way (creates since batchStart, within the window)
	// and the largest one, decaying with the slow rate's time constant
	// from peakAt.
	window, decay time.Duration
	batchStart    time.Time
	batch         int
	peak          float64
	peakAt        time.Time
}

func newDemand(t poolTuning) demand {
	return demand{fast: ewmaRate{tau: t.fastWindow}, slow: ewmaRate{tau: t.slowWindow}, window: t.batchWindow, decay: t.slowWindow}
}

func (d *demand) add(now time.Time) {
	d.fast.add(now)
	d.slow.add(now)
	if now.Sub(d.batchStart) >= d.window {
		d.batchStart, d.batch = now, 0
	}
	d.batch++
	if float64(d.batch) > d.peakNow(now) {
		d.peak, d.peakAt = float64(d.batch), now
	}
}

// peakNow is the largest recent batch, decayed to now.
func (d *demand) peakNow(now time.Time) float64 {
	if d.peak == 0 {
		return 0
	}
	return d.peak * math.Exp(-max(now.Sub(d.peakAt), 0).Seconds()/d.decay.Seconds())
}

// batchSize is the batch the pool is kept ready for: the largest recent
// one, rounded, if it was a batch at all (two creates or more).
func (d *demand) batchSize(now time.Time) int {
	n := int(math.Round(d.peakNow(now)))
	if n < 2 {
		return 0
	}
	return n
}

// rate rises with the fast rate and falls with the slow one.
func (d *demand) rate(now time.Time) float64 {
	return max(d.fast.rate(now), d.slow.rate(now))
}

// footprint is the weighted mean memory, in MiB, that a warm sandbox of
// the pool held once started (each new one weighs a fifth).
type footprint struct{ mean float64 }

func (f *footprint) add(mb float64) {
	if f.mean == 0 {
		f.mean = mb
		return
	}
	f.mean += (mb - f.mean) / 5
}

// or is the footprint in whole MiB (at least 1), or def before one was
// measured.
func (f footprint) or(def int) int {
	if f.mean == 0 {
		return def
	}
	return max(1, int(math.Ceil(f.mean)))
}

// startTime is the weighted mean time a warm sandbox of the pool took to
// start (each new one weighs a fifth).
type startTime struct{ mean time.Duration }

func (s *startTime) add(d time.Duration) {
	if s.mean == 0 {
		s.mean = d
		return
	}
	s.mean += (d - s.mean) / 5
}

func (s startTime) or(def time.Duration) time.Duration {
	if s.mean == 0 {
		return def
	}
	return s.mean
}

// poolTarget is how many warm sandboxes (ready and starting) a pool with
// this create rate (per second), batch size and start time is kept at,
// within [floor, ceiling]. The floor wins over the ceiling: it is the
// operator's.
func poolTarget(rate float64, batch int, start time.Duration, t poolTuning, floor, ceiling int) int {
	n := 0
	if rate >= t.minRate {
		n = int(math.Ceil(rate * (2*start + t.headroom).Seconds()))
	}
	n = max(n, batch)
	return max(min(n, ceiling), floor)
}

// poolCeiling is the most warm sandboxes of memoryMB each the budget holds,
// and at most maxSandboxes.
func poolCeiling(budgetMB, memoryMB, maxSandboxes int) int {
	if memoryMB <= 0 {
		return maxSandboxes
	}
	return min(budgetMB/memoryMB, maxSandboxes)
}

// poolWant is one pool's claim on the shared memory budget: its floor,
// the warm sandboxes its demand alone would keep (its target without the
// budget) and the memory of each.
type poolWant struct {
	floor, want, memoryMB int
}

// fairCeilings shares the pools' memory budget max-min fairly: what the
// floors hold comes first (they are the operator's), and the rest is
// split so that no pool gets more than an equal share while another that
// wants more gets less; a pool wanting less than its share leaves the
// remainder to the others. It returns each pool's ceiling (in sandboxes,
// never below its floor). Without it, one tenant's busy template could
// hold the whole budget and leave the other templates' pools empty.
func fairCeilings(pools []poolWant, budgetMB int) []int {
	ceilings := make([]int, len(pools))
	free := budgetMB
	var order []int // pools wanting more than their floor
	for i, p := range pools {
		ceilings[i] = p.floor
		free -= p.floor * max(p.memoryMB, 1)
		if p.want > p.floor {
			order = append(order, i)
		}
	}
	extra := func(i int) int { return (pools[i].want - pools[i].floor) * max(pools[i].memoryMB, 1) }
	// Water-filling: the smallest claims are met in full first.
	slices.SortStableFunc(order, func(a, b int) int { return extra(a) - extra(b) })
	for k, i := range order {
		if free <= 0 {
			break
		}
		share := free / (len(order) - k)
		got := min(extra(i), share)
		n := got / max(pools[i].memoryMB, 1)
		ceilings[i] += n
		free -= n * max(pools[i].memoryMB, 1)
	}
	return ceilings
}
