package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// latencies collects durations and reports their median and p99.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

func (l *latencies) pct(p float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// run calls f n times from workers goroutines, timing each call; it
// stops early at deadline. It returns the calls made per second.
func run(b testing.TB, n, workers int, deadline time.Duration, l *latencies, f func(i int) error) float64 {
	b.Helper()
	var next, done int
	var mu sync.Mutex
	var firstErr error
	stop := time.Now().Add(deadline)
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n || time.Now().After(stop) {
					return
				}
				t0 := time.Now()
				err := f(i)
				l.add(time.Since(t0))
				mu.Lock()
				done++
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return float64(done) / time.Since(start).Seconds()
}

// runPaced starts f(0..n-1) at rate per second, on schedule whatever the
// earlier ones' progress (at most inFlight at once), and records each
// one's latency from its scheduled start, so that a stall shows in the
// latencies of the calls it delayed. It returns the rate of completed
// calls.
func runPaced(b testing.TB, n int, rate float64, inFlight int, deadline time.Duration, l *latencies, f func(i int) error) float64 {
	b.Helper()
	var mu sync.Mutex
	var firstErr error
	slots := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(deadline)
	done := 0
	for i := range n {
		due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if due.After(stop) {
			break
		}
		time.Sleep(time.Until(due))
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			err := f(i)
			l.add(time.Since(due))
			mu.Lock()
			done++
			if err != nil && firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return float64(done) / time.Since(start).Seconds()
}

// create makes a sandbox through api replica i.
func (c *simCluster) create(i int) (string, error) {
	code, body, _, err := c.do(i, "POST", "/sandboxes", `{"templateID":"base","timeout":3600,"metadata":{"shard":"x"}}`)
	if err != nil {
		return "", err
	}
	if code != http.StatusCreated {
		return "", fmt.Errorf("create: %d %s", code, body)
	}
	var out struct {
		SandboxID string `json:"sandboxID"`
	}
	return out.SandboxID, json.Unmarshal(body, &out)
}

// list gets one page of GET /v2/sandboxes with query q.
func (c *simCluster) list(i int, q string) (int, string, error) {
	code, body, h, err := c.do(i, "GET", "/v2/sandboxes?"+q, "")
	if err != nil {
		return 0, "", err
	}
	if code != http.StatusOK {
		return 0, "", fmt.Errorf("list %s: %d %s", q, code, body)
	}
	var out []json.RawMessage
	if err := json.Unmarshal(body, &out); err != nil {
		return 0, "", err
	}
	return len(out), h.Get("X-Next-Token"), nil
}

// BenchmarkControlPlane is the measurement of issue 28: 100 simulated
// nodes heartbeating every 2 s against one PostgreSQL, 10,000 running and
// 50,000 paused sandbox records, two api replicas. Run it once (make
// bench-scale: -benchtime=1x); SCALE_NODES, SCALE_RUNNING, SCALE_PAUSED,
// SCALE_CREATES change its size.
func BenchmarkControlPlane(b *testing.B) {
	nodes, running, paused, creates := envInt("SCALE_NODES", 100), envInt("SCALE_RUNNING", 10000), envInt("SCALE_PAUSED", 50000), envInt("SCALE_CREATES", 5000)
	c := newSimCluster(b, simConfig{Nodes: nodes, APIs: 2, Heartbeat: 2 * time.Second})
	t0 := time.Now()
	c.seed(b, running, paused)
	b.Logf("seeded %d running + %d paused records on %d nodes in %v", running, paused, nodes, time.Since(t0).Round(time.Millisecond))
	b.ResetTimer()

	// Heartbeats alone: PostgreSQL's CPU over 10 s, as a share of one core.
	const window = 10 * time.Second
	ticks0 := c.pg.cpuTicks()
	time.Sleep(window)
	hz := 100.0 // USER_HZ on Linux
	pgCPU := float64(c.pg.cpuTicks()-ticks0) / hz / window.Seconds() * 100
	b.ReportMetric(pgCPU, "pg-cpu-%-heartbeats")

	// Creates through the two replicas.
	var cl latencies
	ids := make([]string, creates)
	probe := c.probe(b, "creates")
	rate := run(b, creates, 32, 2*time.Minute, &cl, func(i int) error {
		id, err := c.create(i)
		ids[i] = id
		return err
	})
	probe.end(len(cl.d))
	b.ReportMetric(rate, "creates/s")
	b.ReportMetric(ms(cl.pct(0.5)), "create-p50-ms")
	b.ReportMetric(ms(cl.pct(0.99)), "create-p99-ms")

	// Listing: the first page, filtered, and pages on.
	listing := func(name, q string, pages int) {
		var l latencies
		probe := c.probe(b, name)
		defer func() { probe.end(len(l.d)) }()
		run(b, 100, 4, time.Minute, &l, func(i int) error {
			page := q
			for range pages {
				_, next, err := c.list(i, page)
				if err != nil {
					return err
				}
				if next == "" {
					break
				}
				page = strings.TrimPrefix(q+"&nextToken="+next, "&")
			}
			return nil
		})
		b.ReportMetric(ms(l.pct(0.5)), name+"-p50-ms")
		b.ReportMetric(ms(l.pct(0.99)), name+"-p99-ms")
	}
	listing("list-first", "", 1)
	listing("list-running", "state=running", 1)
	listing("list-paused", "state=paused", 1)
	listing("list-metadata", "metadata=shard%3D3", 1)
	listing("list-5pages", "limit=100", 5)

	// Creates offered at a steady rate (SCALE_PACED_RATE, default 500/s,
	// the target) for 10 s, as clients arrive rather than as fast
	// as 32 of them can go: the latency a create sees at that rate.
	paced := envInt("SCALE_PACED_RATE", 500)
	var pl latencies
	probe = c.probe(b, "paced-creates")
	prate := runPaced(b, paced*10, float64(paced), 512, time.Minute, &pl, func(i int) error {
		_, err := c.create(creates + i)
		return err
	})
	probe.end(len(pl.d))
	b.ReportMetric(prate, "paced-creates/s")
	b.ReportMetric(ms(pl.pct(0.5)), "paced-create-p50-ms")
	b.ReportMetric(ms(pl.pct(0.99)), "paced-create-p99-ms")

	// The proxy's routing lookups (each api's Locate), for known IDs.
	var rl latencies
	all := c.running
	lookups := run(b, 200000, 8, 10*time.Second, &rl, func(i int) error {
		_, _, err := c.disps[i%2].Locate(context.Background(), all[rand.IntN(len(all))])
		return err
	})
	b.ReportMetric(lookups, "route-lookups/s")
	b.ReportMetric(ms(rl.pct(0.99)), "route-p99-ms")

	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	b.ReportMetric(float64(m.HeapInuse)/(1<<20), "heap-MB")
	b.ReportMetric(float64(rssKB())/1024, "rss-MB")
}

func rssKB() int {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			var kb int
			fmt.Sscanf(strings.TrimPrefix(l, "VmRSS:"), "%d", &kb)
			return kb
		}
	}
	return 0
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		var n int
		if _, err := fmt.Sscanf(v, "%d", &n); err == nil {
			return n
		}
	}
	return def
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
