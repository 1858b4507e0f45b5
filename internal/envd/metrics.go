package envd

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// metrics is the body of GET /metrics (wire contract §6.5, snake_case).
type metrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskTotal   uint64  `json:"disk_total"`
	DiskUsed    uint64  `json:"disk_used"`
}

// metricsSampler computes CPU use as the busy share of /proc/stat ticks
// since the previous sample.
type metricsSampler struct {
	mu              sync.Mutex
	lastBusy, lastT uint64
}

func newMetricsSampler() *metricsSampler {
	m := &metricsSampler{}
	m.lastBusy, m.lastT, _ = readCPUTicks()
	return m
}

func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.metrics.sample())
}

func (m *metricsSampler) sample() metrics {
	out := metrics{Timestamp: time.Now().Unix(), CPUCount: runtime.NumCPU()}
	if busy, total, err := readCPUTicks(); err == nil {
		m.mu.Lock()
		if dt := total - m.lastT; total > m.lastT {
			out.CPUUsedPct = float64(busy-m.lastBusy) / float64(dt) * 100
		}
		m.lastBusy, m.lastT = busy, total
		m.mu.Unlock()
	}
	if mem, err := readMeminfo(); err == nil {
		out.MemTotal = mem["MemTotal"]
		out.MemCache = mem["Cached"]
		out.MemUsed = out.MemTotal - mem["MemAvailable"]
		out.MemTotalMiB = out.MemTotal >> 20
		out.MemUsedMiB = out.MemUsed >> 20
	}
	var st unix.Statfs_t
	if unix.Statfs("/", &st) == nil {
		out.DiskTotal = st.Blocks * uint64(st.Bsize)
		out.DiskUsed = (st.Blocks - st.Bfree) * uint64(st.Bsize)
	}
	return out
}

// readCPUTicks returns busy and total jiffies from the "cpu" line of /proc/stat.
func readCPUTicks() (busy, total uint64, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[0] != "cpu" {
			continue
		}
		for i, v := range fields[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			total += n
			if i != 3 && i != 4 { // idle, iowait
				busy += n
			}
		}
		return busy, total, nil
	}
	return 0, 0, sc.Err()
}

// readMeminfo returns /proc/meminfo values in bytes.
func readMeminfo() (map[string]uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n <<= 10
		}
		out[key] = n
	}
	return out, sc.Err()
}
