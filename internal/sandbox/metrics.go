package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/team"
)

// Metric is one sample of a sandbox's resource use.
type Metric struct {
	Time       time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    int64
	MemTotal   int64
	// MemCache is the page cache part of MemUsed.
	MemCache  int64
	DiskUsed  int64
	DiskTotal int64
}

// errPaused: a paused sandbox has nothing to sample; its samples from
// before the pause stay.
var errPaused = errors.New("sandbox is paused")

// sampleInterval is how often running sandboxes are sampled, and
// sampleKeep how many samples each keeps (an hour's worth).
const (
	sampleInterval = 5 * time.Second
	sampleKeep     = 720
)

// sampler keeps a sandbox's recent samples and what the next CPU
// percentage is computed from.
type sampler struct {
	mu      sync.Mutex
	samples []Metric
	lastCPU uint64
	lastAt  time.Time
}

// sample reads the sandbox's cgroup and file system now and records it.
func (m *Manager) sample(ctx context.Context, l *live) (Metric, error) {
	inst := m.instance(l)
	if inst == nil {
		return Metric{}, errPaused
	}
	st, err := m.cfg.Node.Stats(ctx, inst)
	if err != nil {
		return Metric{}, err
	}
	now := time.Now()
	s := &l.metrics
	s.mu.Lock()
	defer s.mu.Unlock()
	since := s.lastAt
	if since.IsZero() {
		since = l.startedAt
	}
	cpuCount := l.cpuCount
	met := Metric{Time: now, CPUCount: cpuCount, MemUsed: int64(st.MemoryBytes), MemTotal: int64(l.memoryMB) << 20,
		MemCache: int64(st.MemoryCacheBytes)}
	if st.MemoryLimitBytes > 0 {
		met.MemTotal = int64(st.MemoryLimitBytes)
	}
	if wall := now.Sub(since); wall > 0 && st.CPUUsageNs >= s.lastCPU && cpuCount > 0 {
		met.CPUUsedPct = float64(st.CPUUsageNs-s.lastCPU) / float64(wall.Nanoseconds()) / float64(cpuCount) * 100
		met.CPUUsedPct = min(met.CPUUsedPct, 100)
	}
	// overlayfs reports its upper file system: the sandbox's own disk.
	var fs unix.Statfs_t
	if inst.Rootfs != nil && unix.Statfs(inst.Rootfs.Dir(), &fs) == nil {
		met.DiskTotal = int64(fs.Blocks) * fs.Bsize
		met.DiskUsed = int64(fs.Blocks-fs.Bfree) * fs.Bsize
	}
	s.lastCPU, s.lastAt = st.CPUUsageNs, now
	s.samples = append(s.samples, met)
	if len(s.samples) > sampleKeep {
		s.samples = s.samples[len(s.samples)-sampleKeep:]
	}
	return met, nil
}

// Metrics returns a sandbox's samples between start and end (zero: open).
// A sandbox not sampled yet is sampled now, so there is always one.
func (m *Manager) Metrics(ctx context.Context, teamID team.ID, id string, start, end time.Time) ([]Metric, error) {
	l, err := m.lookup(teamID.Scope(), id)
	if err != nil {
		return nil, err
	}
	l.metrics.mu.Lock()
	empty := len(l.metrics.samples) == 0
	l.metrics.mu.Unlock()
	if empty {
		if _, err := m.sample(ctx, l); err != nil && !errors.Is(err, errPaused) {
			return nil, err
		}
	}
	l.metrics.mu.Lock()
	defer l.metrics.mu.Unlock()
	out := []Metric{}
	for _, s := range l.metrics.samples {
		if (!start.IsZero() && s.Time.Before(start)) || (!end.IsZero() && s.Time.After(end)) {
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// sampleRunning samples every running sandbox.
func (m *Manager) sampleRunning() {
	m.mu.Lock()
	var running []*live
	for _, l := range m.live {
		if !l.paused {
			running = append(running, l)
		}
	}
	m.mu.Unlock()
	for _, l := range running {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = m.sample(ctx, l) // a sandbox killed meanwhile has no cgroup: skip it
		cancel()
	}
}
