package scale

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// countedRunning is the statement CountSandboxes made for one team's
// running sandboxes before the counts were kept (migration 0031): an
// index-only scan of sandboxes_by_team_state, an entry per sandbox.
const countedRunning = "SELECT node, COUNT(*) FROM sandboxes WHERE team_id = $1 AND state IN ($2) GROUP BY node"

// BenchmarkRunningCount times X-Total-Running's count at issue 28's size
// (one team, 10,000 running and 50,000 paused sandboxes on 100 nodes;
// COUNT_RUNNING, COUNT_PAUSED and COUNT_NODES change it), on a PostgreSQL
// of its own: the statement before the kept counts ("counted") against
// CountSandboxes now ("kept"), each call timed through database/sql
// (median and p99), and the server's execution time of each statement by
// EXPLAIN (ANALYZE, BUFFERS) (median of 9). The rows are made by one
// INSERT … SELECT FROM generate_series, then VACUUM ANALYZE, so that the
// old statement's index-only scan reads no table row (its best case);
// COUNT_VACUUM=0 only ANALYZEs, as for rows written since the last
// autovacuum, whose visibility the scan checks in the table. COUNT_CHURN=n
// then pauses n running sandboxes and resumes n paused ones through the
// store before the timing (the running count stays the same).
//
//	go test -run '^$' -bench RunningCount -benchtime 2000x ./test/scale/
func BenchmarkRunningCount(b *testing.B) {
	ctx := context.Background()
	running, paused, nodes := envInt("COUNT_RUNNING", 10000), envInt("COUNT_PAUSED", 50000), envInt("COUNT_NODES", 100)
	pg := startPostgres(b)
	st, err := store.OpenPostgres(ctx, pg.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	db, err := sql.Open("pgx", pg.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if err := st.CreateTeam(ctx, store.Team{ID: "team1", Name: "t", CreatedAt: time.Now()}); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	loadSandboxes(b, db, "team1", running, paused, nodes)
	b.Logf("%d sandbox records made in %v", running+paused, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	churn := envInt("COUNT_CHURN", 0)
	pauseAndResume(b, st, churn, running, paused)
	b.Logf("%d pauses and resumes in %v", churn, time.Since(t0).Round(time.Millisecond))

	kept := func() (map[string]int, error) {
		return st.CountSandboxes(ctx, store.SandboxFilter{Teams: store.ForTeam("team1"), States: []store.SandboxState{store.StateRunning}})
	}
	counted := func() (map[string]int, error) {
		rows, err := db.QueryContext(ctx, countedRunning, "team1", "running")
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var node string
			var n int
			if err := rows.Scan(&node, &n); err != nil {
				return nil, err
			}
			out[node] = n
		}
		return out, rows.Err()
	}
	a, errA := kept()
	c, errC := counted()
	if errA != nil || errC != nil || !maps.Equal(a, c) || len(a) != min(nodes, running) {
		b.Fatalf("kept %v (%v), counted %v (%v): want the same %d nodes", a, errA, c, errC, min(nodes, running))
	}

	keptSQL := "SELECT node, CAST(SUM(n) AS BIGINT) FROM sandbox_counts WHERE team_id = $1 AND state IN ($2) GROUP BY node HAVING SUM(n) > 0"
	for _, s := range []struct {
		name, query string
		call        func() (map[string]int, error)
	}{{"counted", countedRunning, counted}, {"kept", keptSQL, kept}} {
		b.Run(s.name, func(b *testing.B) {
			var l latencies
			for b.Loop() {
				t := time.Now()
				if _, err := s.call(); err != nil {
					b.Fatal(err)
				}
				l.add(time.Since(t))
			}
			b.ReportMetric(ms(l.pct(0.5)), "p50-ms")
			b.ReportMetric(ms(l.pct(0.99)), "p99-ms")
			b.ReportMetric(explainMS(b, db, s.query), "explain-p50-ms")
		})
	}
}

// loadSandboxes makes a team's sandbox records in one statement: running
// ones (as many as asked) spread among the paused, each kind spread over
// the nodes.
func loadSandboxes(b *testing.B, db *sql.DB, team string, running, paused, nodes int) {
	b.Helper()
	ctx := context.Background()
	total := running + paused
	_, err := db.ExecContext(ctx, `INSERT INTO sandboxes (id, team_id, template_id, alias, state, started_at, end_at,
    cpu_count, memory_mb, disk_size_mb, envd_version, envd_access_token, traffic_access_token, metadata, env_vars,
    auto_pause, auto_resume, secure, node, slot, runtime, extra, updated_at, paused_at)
SELECT 'sb' || lpad(i::text, 6, '0'), $1, 'base', 'base',
    CASE WHEN i * $2::bigint / $3 <> (i + 1) * $2::bigint / $3 THEN 'running' ELSE 'paused' END,
    1700000000000 + i * 50, 1800000000000, 1, 256, 1024, '0.6.4', 't', 't',
    '{"shard":"' || (i % 10) || '"}', '{}', 0, 0, 1, 'node' || lpad(((i * $2::bigint / $3 + i) % $4)::text, 3, '0'), '', 'runsc', '{}',
    1700000000000, 0
FROM generate_series(0, $3 - 1) AS i`, team, running, total, nodes)
	if err != nil {
		b.Fatal(err)
	}
	prepare := "VACUUM ANALYZE"
	if envInt("COUNT_VACUUM", 1) == 0 {
		prepare = "ANALYZE"
	}
	if _, err := db.ExecContext(ctx, prepare); err != nil {
		b.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM sandboxes WHERE team_id = $1 AND state = 'running'", team).Scan(&n); err != nil || n != running {
		b.Fatalf("running records: %d, %v; want %d", n, err, running)
	}
}

// pauseAndResume pauses n running sandboxes and resumes n paused ones
// through the store, one transaction each (a live table's writes, after
// the load's VACUUM: row versions, and pages no longer all-visible).
func pauseAndResume(b *testing.B, st store.Store, n, running, paused int) {
	b.Helper()
	ctx := context.Background()
	total := running + paused
	var isRunning, isPaused []string
	for i := 0; i < total && (len(isRunning) < n || len(isPaused) < n); i++ {
		id := fmt.Sprintf("sb%06d", i)
		if i*running/total != (i+1)*running/total {
			isRunning = append(isRunning, id)
		} else {
			isPaused = append(isPaused, id)
		}
	}
	set := func(id string, state store.SandboxState) {
		if _, err := st.UpdateSandbox(ctx, id, func(sb *store.Sandbox) error { sb.State = state; return nil }); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < n && i < len(isRunning) && i < len(isPaused); i++ {
		set(isRunning[i], store.StatePaused)
		set(isPaused[i], store.StateRunning)
	}
}

var executionTime = regexp.MustCompile(`Execution Time: ([0-9.]+) ms`)

// explainMS is the median of 9 runs' execution time of query (for team1's
// running sandboxes) by EXPLAIN (ANALYZE, BUFFERS); the last plan is
// logged.
func explainMS(b *testing.B, db *sql.DB, query string) float64 {
	b.Helper()
	var times []float64
	var plan string
	for range 9 {
		rows, err := db.Query("EXPLAIN (ANALYZE, BUFFERS) "+query, "team1", "running")
		if err != nil {
			b.Fatal(err)
		}
		plan = ""
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				b.Fatal(err)
			}
			plan += line + "\n"
		}
		rows.Close()
		m := executionTime.FindStringSubmatch(plan)
		if m == nil {
			b.Fatalf("no execution time in\n%s", plan)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		times = append(times, v)
	}
	slices.Sort(times)
	b.Log(fmt.Sprintf("%s\n%s", query, plan))
	return times[len(times)/2]
}

// BenchmarkCreateWithCounts times creates with the kept counts' triggers
// and without them (dropped), each in a database of its own on one
// PostgreSQL of the benchmark's, the two alternated: 8 writers creating
// sandboxes of one team on 4 nodes, so that they meet on the same
// counter rows. Reported: median and p99 of a CreateSandbox, creates/s.
//
//	go test -run '^$' -bench CreateWithCounts -benchtime 2000x ./test/scale/
func BenchmarkCreateWithCounts(b *testing.B) {
	ctx := context.Background()
	pg := startPostgres(b)
	admin, err := sql.Open("pgx", pg.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	stores := map[string]store.Store{}
	for _, name := range []string{"kept", "without"} {
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			b.Fatal(err)
		}
		st, err := store.OpenPostgres(ctx, pg.DSN+" dbname="+name)
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		if err := st.CreateTeam(ctx, store.Team{ID: "team1", Name: "t", CreatedAt: time.Now()}); err != nil {
			b.Fatal(err)
		}
		stores[name] = st
	}
	db, err := sql.Open("pgx", pg.DSN+" dbname=without")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for _, trigger := range []string{"insert", "update", "delete"} {
		if _, err := db.ExecContext(ctx, "DROP TRIGGER sandbox_counts_"+trigger+" ON sandboxes"); err != nil {
			b.Fatal(err)
		}
	}
	writers := envInt("COUNT_WRITERS", 8)
	var seq int
	for round := range 2 {
		for _, name := range []string{"kept", "without"} {
			st := stores[name]
			b.Run(fmt.Sprintf("%s-%d", name, round+1), func(b *testing.B) {
				var l latencies
				seq++
				prefix := fmt.Sprintf("r%d-", seq)
				rate := run(b, b.N, writers, time.Minute, &l, func(i int) error {
					at := time.Now()
					return st.CreateSandbox(ctx, store.Sandbox{ID: prefix + strconv.Itoa(i), TeamID: "team1", TemplateID: "base",
						State: store.StateRunning, Node: fmt.Sprintf("node%d", i%4), StartedAt: at, EndAt: at.Add(time.Hour),
						EnvdAccessToken: "t", CPUCount: 1, MemoryMB: 256})
				})
				b.ReportMetric(ms(l.pct(0.5)), "p50-ms")
				b.ReportMetric(ms(l.pct(0.99)), "p99-ms")
				b.ReportMetric(rate, "creates/s")
			})
		}
	}
}
