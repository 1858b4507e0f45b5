package metrics_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/metrics/metricstest"
	"github.com/warren-sandbox/warren/internal/store"
)

// serve starts m's metrics server on a loopback port and returns the
// /metrics URL.
func serve(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := m.NewHTTPServer()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/metrics"
}

func scrape(t *testing.T, u string) metricstest.Families {
	t.Helper()
	f, err := metricstest.Scrape(u)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func value(t *testing.T, f metricstest.Families, name string, labels ...string) float64 {
	t.Helper()
	v, ok := f.Value(name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// fakeNode is a node whose stats the test sets.
type fakeNode struct {
	mu sync.Mutex
	s  metrics.NodeStats
}

func (n *fakeNode) NodeStats() metrics.NodeStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.s
}

func (n *fakeNode) set(s metrics.NodeStats) {
	n.mu.Lock()
	n.s = s
	n.mu.Unlock()
}

// The node gauges are what the source says at each scrape, not a tally.
func TestNodeGaugesReadAtScrape(t *testing.T) {
	m := metrics.New()
	node := &fakeNode{}
	if err := m.WatchNode(node); err != nil {
		t.Fatal(err)
	}
	u := serve(t, m)
	node.set(metrics.NodeStats{Node: "n1", Runtime: "runsc", Running: 3, Paused: 1, Starting: 2,
		Warm: map[string]int{"base": 1}, WarmTarget: map[string]int{"base": 2}, HostCPUs: 4, HostMemoryBytes: 8 << 30,
		CapacityCPUs: 32, CapacityMemoryBytes: 16 << 30, CapacitySandboxes: 100,
		UsedCPUs: 7, UsedMemoryBytes: 3 << 30, UsedSandboxes: 7})
	f := scrape(t, u)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"warren_node_info", []string{"node", "n1", "runtime", "runsc"}, 1},
		{"warren_sandboxes", []string{"state", "running"}, 3},
		{"warren_sandboxes", []string{"state", "paused"}, 1},
		{"warren_sandboxes", []string{"state", "starting"}, 2},
		{"warren_warm_pool_sandboxes", []string{"template", "base"}, 1},
		{"warren_warm_pool_target_sandboxes", []string{"template", "base"}, 2},
		{"warren_node_host_cpus", nil, 4},
		{"warren_node_host_memory_bytes", nil, 8 << 30},
		{"warren_node_capacity_cpus", nil, 32},
		{"warren_node_used_cpus", nil, 7},
		{"warren_node_capacity_memory_bytes", nil, 16 << 30},
		{"warren_node_used_memory_bytes", nil, 3 << 30},
		{"warren_node_capacity_sandbox_slots", nil, 100},
		{"warren_node_used_sandbox_slots", nil, 7},
	} {
		if got := value(t, f, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	node.set(metrics.NodeStats{Running: 0, Paused: 0, Warm: map[string]int{"base": 0}})
	f = scrape(t, u)
	if got := value(t, f, "warren_sandboxes", "state", "running"); got != 0 {
		t.Errorf("after the sandboxes ended: running = %g", got)
	}
	if got := value(t, f, "warren_warm_pool_sandboxes", "template", "base"); got != 0 {
		t.Errorf("after the pool emptied: warm = %g", got)
	}
	// The Go runtime's and the process's collectors are there too.
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := f.Value(name); !ok {
			t.Errorf("%s is missing", name)
		}
	}
}

func TestOperationsAndBuilds(t *testing.T) {
	m := metrics.New()
	u := serve(t, m)
	m.Observe("create", 40*time.Millisecond, metrics.OutcomeOK)
	m.Observe("create", 2*time.Second, metrics.OutcomeOK)
	m.Observe("create", time.Millisecond, metrics.OutcomeNoCapacity)
	m.Observe("pause", 10*time.Millisecond, metrics.OutcomeOK)
	m.BuildFinished(90*time.Second, metrics.OutcomeOK)
	m.BuildFinished(time.Second, metrics.OutcomeCanceled)
	f := scrape(t, u)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"warren_sandbox_operations_total", []string{"operation", "create", "outcome", "ok"}, 2},
		{"warren_sandbox_operations_total", []string{"operation", "create", "outcome", "no_capacity"}, 1},
		{"warren_sandbox_operations_total", []string{"operation", "pause", "outcome", "ok"}, 1},
		{"warren_sandbox_operation_duration_seconds", []string{"operation", "create", "outcome", "ok"}, 2},
		{"warren_template_builds_total", []string{"outcome", "ok"}, 1},
		{"warren_template_builds_total", []string{"outcome", "canceled"}, 1},
		{"warren_template_build_duration_seconds", []string{"outcome", "ok"}, 1},
	} {
		if got := value(t, f, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	for _, s := range f["warren_sandbox_operation_duration_seconds"].GetMetric() {
		labels := map[string]string{}
		for _, lp := range s.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if labels["operation"] == "create" && labels["outcome"] == "ok" {
			if sum := s.Histogram.GetSampleSum(); sum < 2.039 || sum > 2.041 {
				t.Errorf("create durations sum to %g s, want 2.04", sum)
			}
		}
	}
}

// The metrics server serves /metrics and nothing else.
func TestServerServesOnlyMetrics(t *testing.T) {
	u := serve(t, metrics.New())
	base := strings.TrimSuffix(u, "/metrics")
	for path, want := range map[string]int{"/metrics": 200, "/": 404, "/health": 404, "/sandboxes": 404} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// brokenStore answers every call with an error; the embedded nil
// interface makes a method the test forgot panic.
type brokenStore struct{ store.Store }

func (brokenStore) GetSandbox(context.Context, string) (store.Sandbox, error) {
	return store.Sandbox{}, fmt.Errorf("sandbox x: %w", store.ErrNotFound)
}

func (brokenStore) ListTeams(context.Context) ([]store.Team, error) {
	return nil, errors.New("database is locked")
}

// Every method of store.Store is timed under its own name: a method added
// to the interface without a wrapper fails here.
func TestStoreTimesEveryMethod(t *testing.T) {
	m := metrics.New()
	wrapped := reflect.ValueOf(m.Store(brokenStore{}))
	iface := reflect.TypeOf((*store.Store)(nil)).Elem()
	for i := range iface.NumMethod() {
		meth := iface.Method(i)
		if meth.Name == "Close" {
			continue
		}
		fn := wrapped.MethodByName(meth.Name)
		args := make([]reflect.Value, fn.Type().NumIn())
		for j := range args {
			args[j] = reflect.Zero(fn.Type().In(j))
		}
		func() {
			defer func() { _ = recover() }() // the nil inner store's methods panic
			if fn.Type().IsVariadic() {
				fn.CallSlice(args)
			} else {
				fn.Call(args)
			}
		}()
	}
	f := scrape(t, serve(t, m))
	for i := range iface.NumMethod() {
		name := iface.Method(i).Name
		if name == "Close" {
			continue
		}
		if v, ok := f.Value("warren_store_operation_duration_seconds", "operation", name); !ok || v != 1 {
			t.Errorf("store.%s is not timed under its name (%g samples): give it a wrapper in internal/metrics/store.go", name, v)
		}
	}
	// A failure is counted; not found is an answer, not a failure.
	if v, _ := f.Value("warren_store_errors_total", "operation", "ListTeams"); v != 1 {
		t.Errorf("ListTeams' error counted %g times, want 1", v)
	}
	if v, ok := f.Value("warren_store_errors_total", "operation", "GetSandbox"); ok && v != 0 {
		t.Errorf("GetSandbox's not found counted as an error")
	}
}

// The proxy wrapper counts by status class and counts the bytes both
// ways, through a real httputil.ReverseProxy, an upgraded connection
// included.
func TestProxyCountsRequestsAndBytes(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/echo":
			b, _ := io.ReadAll(r.Body)
			w.Write(b)
		case "/missing":
			http.Error(w, "no", http.StatusNotFound)
		case "/upgrade":
			// A protocol of its own: after the 101, every line is echoed.
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			line, _ := brw.ReadString('\n')
			brw.WriteString(line)
			brw.Flush()
		}
	}))
	defer backend.Close()
	target, _ := url.Parse(backend.URL)
	m := metrics.New()
	front := httptest.NewServer(m.Proxy(httputil.NewSingleHostReverseProxy(target)))
	defer front.Close()

	body := strings.Repeat("x", 1000)
	resp, err := http.Post(front.URL+"/echo", "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp, err = http.Get(front.URL + "/missing")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	up, err := http.ReadResponse(br, nil)
	if err != nil || up.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", up, err)
	}
	line := strings.Repeat("y", 500) + "\n"
	fmt.Fprint(conn, line)
	got, err := br.ReadString('\n')
	if err != nil || got != line {
		t.Fatalf("echo through the upgraded connection: %q %v", got, err)
	}
	conn.Close()

	f := scrape(t, serve(t, m))
	// The upgraded exchange is counted when the proxy's handler returns.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if v, _ := f.Value("warren_proxy_requests_total", "code_class", "1xx"); v == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
		f = scrape(t, serve(t, m))
	}
	for class, want := range map[string]float64{"2xx": 1, "4xx": 1, "1xx": 1} {
		if got, _ := f.Value("warren_proxy_requests_total", "code_class", class); got != want {
			t.Errorf("%s requests: %g, want %g", class, got, want)
		}
	}
	// In: the 1000-byte body and the 500-byte line; out: the echoed body,
	// the 404's text, the 101's head and the echoed line.
	if in := value(t, f, "warren_proxy_received_bytes_total"); in < 1500 || in > 1600 {
		t.Errorf("received %g bytes, want the 1000 of the body and the 501 of the line", in)
	}
	if out := value(t, f, "warren_proxy_sent_bytes_total"); out < 1501 || out > 1700 {
		t.Errorf("sent %g bytes, want the echoed 1000 and 501 and a few heads", out)
	}
}

// Every warren_ label is one of a closed set: nothing can carry a
// sandbox, team or build ID.
func TestLabelNamesBounded(t *testing.T) {
	m := metrics.New()
	node := &fakeNode{s: metrics.NodeStats{Node: "n1", Runtime: "runc", Warm: map[string]int{"base": 1}}}
	if err := m.WatchNode(node); err != nil {
		t.Fatal(err)
	}
	m.Observe("create", time.Second, metrics.OutcomeOK)
	m.BuildFinished(time.Second, metrics.OutcomeOK)
	st := m.Store(brokenStore{})
	st.GetSandbox(context.Background(), "sbx-secret-id")
	f := scrape(t, serve(t, m))
	allowed := []string{"operation", "outcome", "state", "template", "code_class", "node", "runtime"}
	for name := range f.Labels("warren_") {
		if name != "le" && !slices.Contains(allowed, name) {
			t.Errorf("label %q is not in the bounded set %v", name, allowed)
		}
	}
	if where, found := f.Contains("sbx-secret-id"); found {
		t.Errorf("a sandbox ID reached a label: %s", where)
	}
}

// The names follow Prometheus' conventions (promlint: units, _total on
// counters only, help texts).
func TestNamesPassPromlint(t *testing.T) {
	m := metrics.New()
	if err := m.WatchNode(&fakeNode{s: metrics.NodeStats{Warm: map[string]int{"base": 0}}}); err != nil {
		t.Fatal(err)
	}
	m.Observe("create", time.Second, metrics.OutcomeOK)
	m.BuildFinished(time.Second, metrics.OutcomeOK)
	m.Store(brokenStore{}).ListTeams(context.Background())
	h := m.Proxy(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "warren_") {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
	if n := len(mfs); n < 20 {
		t.Errorf("only %d metric families gathered", n)
	}
}
