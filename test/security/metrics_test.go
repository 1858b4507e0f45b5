package security

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/metrics/metricstest"
)

// Issue 17: Prometheus metrics are served on --metrics-addr only. The API
// and the proxy, whose clients are tenants, never serve them (they would
// tell one team about the node's other tenants), and no metric names a
// sandbox or a team.

func TestMetricsAreNotServedToTenants(t *testing.T) {
	requireFlag(t, "metrics-addr", "issue 17's metrics")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exposition := func(body string) bool {
		return strings.Contains(body, "warren_sandboxes") || strings.Contains(body, "go_goroutines")
	}
	// The API, with and without a key, and the proxy, whatever the Host.
	for _, tm := range []team{{}, S.teamA} {
		r, err := S.srv.call(ctx, tm, "GET", "/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == http.StatusOK || exposition(string(r.Body)) {
			t.Errorf("the API serves /metrics (key %v): %s", tm.key != "", r)
		}
	}
	for _, host := range []string{"", "metrics", "localhost", "49983-x.localhost", S.srv.metricsAddr} {
		req, _ := http.NewRequestWithContext(ctx, "GET", S.srv.proxyURL+"/metrics", nil)
		if host != "" {
			req.Host = host
		}
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == http.StatusOK || exposition(string(r.Body)) {
			t.Errorf("the proxy serves /metrics (Host %q): %s", host, r)
		}
	}
	// The metrics listener serves them.
	if _, err := metricstest.Scrape("http://" + S.srv.metricsAddr + "/metrics"); err != nil {
		t.Fatalf("the metrics listener: %v", err)
	}
}

// A create through the real API moves the counters and gauges, and
// neither its sandbox's ID nor its team's is among the label values.
func TestMetricsCountACreateWithoutIDs(t *testing.T) {
	requireFlag(t, "metrics-addr", "issue 17's metrics")
	url := "http://" + S.srv.metricsAddr + "/metrics"
	before, err := metricstest.Scrape(url)
	if err != nil {
		t.Fatal(err)
	}
	value := func(f metricstest.Families, name string, labels ...string) float64 {
		v, _ := f.Value(name, labels...)
		return v
	}
	sb := mustCreate(t, S.teamB, createOpts{})
	after, err := metricstest.Scrape(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{"warren_sandbox_operations_total", []string{"operation", "create", "outcome", "ok"}},
		{"warren_sandbox_operation_duration_seconds", []string{"operation", "create", "outcome", "ok"}},
		{"warren_store_operation_duration_seconds", []string{"operation", "CreateSandbox"}},
	} {
		if b, a := value(before, c.name, c.labels...), value(after, c.name, c.labels...); a != b+1 {
			t.Errorf("%s%v went from %g to %g over one create", c.name, c.labels, b, a)
		}
	}
	if v := value(after, "warren_sandboxes", "state", "running"); v < 1 {
		t.Errorf("running sandboxes with one just created: %g", v)
	}
	if v := value(after, "warren_node_used_sandbox_slots"); v < 1 {
		t.Errorf("used sandbox slots with one just created: %g", v)
	}
	for _, id := range []string{sb.ID, S.teamA.id, S.teamB.id} {
		if where, found := after.Contains(id); found {
			t.Errorf("ID %s is a label value: %s", id, where)
		}
	}
	allowed := map[string]bool{"operation": true, "outcome": true, "state": true, "template": true, "code_class": true, "node": true, "runtime": true, "le": true}
	for name, values := range after.Labels("warren_") {
		if !allowed[name] {
			t.Errorf("label %s (values %v) is not in the bounded set", name, values)
		}
		if len(values) > 64 {
			t.Errorf("label %s has %d values", name, len(values))
		}
	}
}
