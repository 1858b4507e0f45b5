package sandbox

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/metrics/metricstest"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/team"
)

// The metrics follow what the manager does: a real create from the warm
// pool, a failed create, a pause, a resume and a kill, scraped from the
// metrics server as Prometheus would.
func TestMetricsFollowTheManager(t *testing.T) {
	met := metrics.New()
	e := start(t, newStore(t), Config{PoolSize: 1, Observer: met})
	defer e.destroy()
	if err := met.WatchNode(e.mgr); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := met.NewHTTPServer()
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/metrics"
	scrape := func() metricstest.Families {
		t.Helper()
		f, err := metricstest.Scrape(url)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	val := func(f metricstest.Families, name string, labels ...string) float64 {
		v, _ := f.Value(name, labels...)
		return v
	}
	e.waitWarm(1)
	f := scrape()
	if v := val(f, "warren_warm_pool_sandboxes", "template", "base"); v != 1 {
		t.Errorf("warm pool of base: %g, want 1", v)
	}
	if v := val(f, "warren_sandboxes", "state", "running"); v != 0 {
		t.Errorf("running before any create: %g", v)
	}
	if v := val(f, "warren_node_used_sandbox_slots"); v != 1 {
		t.Errorf("used slots with one warm sandbox: %g, want 1", v)
	}
	if v := val(f, "warren_node_capacity_sandbox_slots"); v != 100 {
		t.Errorf("slots: %g, want the default 100", v)
	}

	rec, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.create(CreateRequest{TemplateID: "no-such-template"}); err == nil {
		t.Fatal("a create of a missing template succeeded")
	}
	f = scrape()
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"warren_sandbox_operations_total", []string{"operation", "create", "outcome", "ok"}, 1},
		{"warren_sandbox_operations_total", []string{"operation", "create", "outcome", "not_found"}, 1},
		{"warren_sandbox_operation_duration_seconds", []string{"operation", "create", "outcome", "ok"}, 1},
		{"warren_sandboxes", []string{"state", "running"}, 1},
		{"warren_sandboxes", []string{"state", "starting"}, 0},
		{"warren_node_info", []string{"node", "local", "runtime", "runc"}, 1},
	} {
		if got := val(f, c.name, c.labels...); got != c.want {
			t.Errorf("after the creates: %s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	if v := val(f, "warren_node_used_cpus"); v < 1 {
		t.Errorf("used CPUs with a running sandbox: %g", v)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.mgr.Pause(ctx, team.MustParse("t1"), rec.ID, false); err != nil { // runc here: the files only
		t.Fatal(err)
	}
	f = scrape()
	if got := val(f, "warren_sandboxes", "state", "paused"); got != 1 {
		t.Errorf("paused after a pause: %g", got)
	}
	if got := val(f, "warren_sandbox_operations_total", "operation", "pause", "outcome", "ok"); got != 1 {
		t.Errorf("pauses: %g", got)
	}
	if _, resumed, err := e.mgr.Connect(ctx, team.MustParse("t1"), rec.ID, time.Minute, false); err != nil || !resumed {
		t.Fatalf("connect: resumed %v, %v", resumed, err)
	}
	if err := e.mgr.Kill(ctx, team.MustParse("t1"), rec.ID); err != nil {
		t.Fatal(err)
	}
	f = scrape()
	if got := val(f, "warren_sandbox_operations_total", "operation", "resume", "outcome", "ok"); got != 1 {
		t.Errorf("resumes: %g", got)
	}
	if got := val(f, "warren_sandboxes", "state", "running") + val(f, "warren_sandboxes", "state", "paused"); got != 0 {
		t.Errorf("sandboxes after the kill: %g", got)
	}
	if got := val(f, "warren_store_operation_duration_seconds", "operation", "CreateSandbox"); got != 0 {
		t.Errorf("the store was not wrapped here, yet CreateSandbox has %g samples", got)
	}

	// No ID is a label: not the sandbox's, not the team's.
	if where, found := f.Contains(rec.ID); found {
		t.Errorf("the sandbox ID is a label value: %s", where)
	}
	for name, values := range f.Labels("warren_") {
		if slices.Contains(values, "t1") {
			t.Errorf("the team ID is a value of label %s", name)
		}
	}
	// The pool refills: its gauge says so once it has.
	if !poll.Within(30*time.Second, 50*time.Millisecond, func() bool {
		v, _ := scrape().Value("warren_warm_pool_sandboxes", "template", "base")
		return v == 1
	}) {
		t.Error("the warm pool gauge did not return to 1 after the refill")
	}
}
