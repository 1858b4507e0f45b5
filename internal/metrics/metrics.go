// Package metrics is Warren's Prometheus instrumentation: one registry
// per server with the Go and process collectors and every warren_*
// metric, served by `warren serve --metrics-addr` on a listener of its
// own (never the API's or the proxy's).
//
// Other packages are instrumented through small hooks, so that they do
// not depend on Prometheus: the sandbox manager reports its operations to
// an Observer (Metrics.Observe) and its counts are read at scrape time
// (WatchNode: gauges that cannot drift, unlike counters kept by hand);
// the template builder reports each build's end (BuildFinished); the store
// and the proxy are wrapped from outside (Store, Proxy).
//
// Labels are bounded sets only: operation and outcome names, status
// classes, store methods, template IDs of the warm pools the operator
// configured (the pools made on demand are summed as "other"), the
// node's own name. Never a sandbox, team or build ID.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Outcomes of an operation, the values of the outcome label. The sandbox
// manager and the builder map their errors to these.
const (
	OutcomeOK         = "ok"
	OutcomeInvalid    = "invalid"
	OutcomeNotFound   = "not_found"
	OutcomeNoCapacity = "no_capacity"
	OutcomeTeamLimit  = "team_limit"
	OutcomeConflict   = "conflict"
	OutcomeCanceled   = "canceled"
	OutcomeError      = "error"
)

// Buckets of the duration histograms, in seconds: sandbox operations take
// milliseconds (a warm create, a pause) to tens of seconds (a cold create
// under load); builds take seconds to an hour; store calls take
// microseconds to seconds.
var (
	operationBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	buildBuckets     = []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600}
	storeBuckets     = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}
)

// Metrics is the registry and Warren's metrics in it. Its methods are safe
// for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	sandboxOps    *prometheus.CounterVec
	sandboxOpTime *prometheus.HistogramVec
	builds        *prometheus.CounterVec
	buildTime     *prometheus.HistogramVec
	// blobCache is set by BlobStore (blobstore.go).
	blobCache     *prometheus.CounterVec
	proxyRequests *prometheus.CounterVec
	proxyBytesIn  prometheus.Counter
	proxyBytesOut prometheus.Counter
	storeTime     *prometheus.HistogramVec
	storeErrors   *prometheus.CounterVec
	webhooks      webhookMetrics
}

// New returns a registry holding the Go runtime and process collectors
// and Warren's metrics; the node's gauges come with WatchNode.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		sandboxOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_sandbox_operations_total",
			Help: "Sandbox operations this node's manager ended (create, pause, resume), by operation and outcome.",
		}, []string{"operation", "outcome"}),
		sandboxOpTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warren_sandbox_operation_duration_seconds",
			Help:    "How long sandbox operations took (a create: until the sandbox is usable), by operation and outcome.",
			Buckets: operationBuckets,
		}, []string{"operation", "outcome"}),
		builds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_template_builds_total",
			Help: "Template builds that ended on this node, by outcome (ok, error, canceled).",
		}, []string{"outcome"}),
		buildTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warren_template_build_duration_seconds",
			Help:    "How long template builds took from their start request (queueing included) to their end, by outcome.",
			Buckets: buildBuckets,
		}, []string{"outcome"}),
		proxyRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_proxy_requests_total",
			Help: "Requests the sandbox proxy answered, by status class (1xx for upgraded connections such as WebSockets).",
		}, []string{"code_class"}),
		proxyBytesIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warren_proxy_received_bytes_total",
			Help: "Bytes of request bodies and upgraded connections the sandbox proxy read from its clients.",
		}),
		proxyBytesOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warren_proxy_sent_bytes_total",
			Help: "Bytes of response bodies and upgraded connections the sandbox proxy wrote to its clients.",
		}),
		storeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warren_store_operation_duration_seconds",
			Help:    "How long calls of the store (SQLite or PostgreSQL) took, by store method.",
			Buckets: storeBuckets,
		}, []string{"operation"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_store_errors_total",
			Help: "Store calls that failed (not counting the answers not found and conflict), by store method.",
		}, []string{"operation"}),
		webhooks: newWebhookMetrics(),
	}
	m.reg.MustRegister(m.webhooks.collectors()...)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.sandboxOps, m.sandboxOpTime, m.builds, m.buildTime,
		m.proxyRequests, m.proxyBytesIn, m.proxyBytesOut, m.storeTime, m.storeErrors,
	)
	return m
}

// Registry is where the metrics are; tests gather from it.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in Prometheus' exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, MaxRequestsInFlight: 4})
}

// NewHTTPServer returns the server of the metrics listener: /metrics, and
// 404 for anything else.
func (m *Metrics) NewHTTPServer() *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
}

// Observe records a sandbox operation that took d and ended with outcome
// (one of the Outcome constants). It is the sandbox manager's Observer.
func (m *Metrics) Observe(operation string, d time.Duration, outcome string) {
	m.sandboxOps.WithLabelValues(operation, outcome).Inc()
	m.sandboxOpTime.WithLabelValues(operation, outcome).Observe(d.Seconds())
}

// BuildFinished records a template build that took d and ended with
// outcome (OutcomeOK, OutcomeError or OutcomeCanceled). It is the
// template builder's Observer.
func (m *Metrics) BuildFinished(d time.Duration, outcome string) {
	m.builds.WithLabelValues(outcome).Inc()
	m.buildTime.WithLabelValues(outcome).Observe(d.Seconds())
}
