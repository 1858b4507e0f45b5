package metrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// NodeStats is what a node holds at one moment; the sandbox manager
// computes it (sandbox.Manager.NodeStats) when Prometheus scrapes.
type NodeStats struct {
	// Node is the node's name (--node-name), Runtime its sandbox runtime.
	Node, Runtime string
	// Running and Paused are the node's sandboxes in those states;
	// Starting the creates in flight (warm sandboxes not included).
	Running, Paused, Starting int
	// Warm is the number of ready warm sandboxes of each template that has
	// a warm pool; WarmTarget the size each pool is kept at now. Pools of
	// templates the operator did not configure are summed under "other".
	Warm, WarmTarget map[string]int
	// The host's CPUs and memory.
	HostCPUs        int
	HostMemoryBytes int64
	// Capacity is what placement may hand out (the host's totals times
	// the overcommit, and --max-sandboxes); Used what sandboxes hold of
	// it nominally: live, starting and warm ones.
	CapacityCPUs        float64
	CapacityMemoryBytes int64
	CapacitySandboxes   int
	UsedCPUs            int
	UsedMemoryBytes     int64
	UsedSandboxes       int
}

// NodeSource is what the node gauges are read from at each scrape.
type NodeSource interface {
	NodeStats() NodeStats
}

// WatchNode adds the gauges read from src at each scrape: sandboxes by
// state, warm pools, and the node's capacity and use.
func (m *Metrics) WatchNode(src NodeSource) error {
	return m.reg.Register(&nodeCollector{src: src})
}

var (
	nodeInfoDesc = prometheus.NewDesc("warren_node_info",
		"Always 1; its labels name this node and its sandbox runtime.", []string{"node", "runtime"}, nil)
	sandboxesDesc = prometheus.NewDesc("warren_sandboxes",
		"Sandboxes on this node by state: running, paused, starting (creates in flight; warm sandboxes are not counted).", []string{"state"}, nil)
	warmDesc = prometheus.NewDesc("warren_warm_pool_sandboxes",
		"Ready warm sandboxes in the pool of each template.", []string{"template"}, nil)
	warmTargetDesc = prometheus.NewDesc("warren_warm_pool_target_sandboxes",
		"The size each template's warm pool is kept at now (adaptive, at least --pool-size).", []string{"template"}, nil)
	hostCPUsDesc = prometheus.NewDesc("warren_node_host_cpus",
		"CPUs of the host.", nil, nil)
	hostMemoryDesc = prometheus.NewDesc("warren_node_host_memory_bytes",
		"Memory of the host.", nil, nil)
	capCPUsDesc = prometheus.NewDesc("warren_node_capacity_cpus",
		"CPUs the node may hand to sandboxes: host CPUs times --cpu-overcommit.", nil, nil)
	usedCPUsDesc = prometheus.NewDesc("warren_node_used_cpus",
		"CPUs the node's sandboxes (live, starting, warm) hold nominally.", nil, nil)
	capMemoryDesc = prometheus.NewDesc("warren_node_capacity_memory_bytes",
		"Memory the node may hand to sandboxes: host memory times --memory-overcommit.", nil, nil)
	usedMemoryDesc = prometheus.NewDesc("warren_node_used_memory_bytes",
		"Memory the node's sandboxes (live, starting, warm) hold nominally.", nil, nil)
	capSlotsDesc = prometheus.NewDesc("warren_node_capacity_sandbox_slots",
		"Sandboxes the node may hold, warm ones included (--max-sandboxes).", nil, nil)
	usedSlotsDesc = prometheus.NewDesc("warren_node_used_sandbox_slots",
		"Sandboxes the node holds: live, starting and warm.", nil, nil)
)

// nodeCollector reads the node's counts at scrape time, so that the
// gauges are what the manager holds, never a tally that drifted.
type nodeCollector struct{ src NodeSource }

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{nodeInfoDesc, sandboxesDesc, warmDesc, warmTargetDesc, hostCPUsDesc, hostMemoryDesc,
		capCPUsDesc, usedCPUsDesc, capMemoryDesc, usedMemoryDesc, capSlotsDesc, usedSlotsDesc} {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.NodeStats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(nodeInfoDesc, 1, s.Node, s.Runtime)
	gauge(sandboxesDesc, float64(s.Running), "running")
	gauge(sandboxesDesc, float64(s.Paused), "paused")
	gauge(sandboxesDesc, float64(s.Starting), "starting")
	templates := make([]string, 0, len(s.Warm))
	for t := range s.Warm {
		templates = append(templates, t)
	}
	sort.Strings(templates)
	for _, t := range templates {
		gauge(warmDesc, float64(s.Warm[t]), t)
		gauge(warmTargetDesc, float64(s.WarmTarget[t]), t)
	}
	gauge(hostCPUsDesc, float64(s.HostCPUs))
	gauge(hostMemoryDesc, float64(s.HostMemoryBytes))
	gauge(capCPUsDesc, s.CapacityCPUs)
	gauge(usedCPUsDesc, float64(s.UsedCPUs))
	gauge(capMemoryDesc, float64(s.CapacityMemoryBytes))
	gauge(usedMemoryDesc, float64(s.UsedMemoryBytes))
	gauge(capSlotsDesc, float64(s.CapacitySandboxes))
	gauge(usedSlotsDesc, float64(s.UsedSandboxes))
}
