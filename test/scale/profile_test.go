package scale

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Diagnostics of a benchmark phase, off unless asked for (docs/scale.md):
// SCALE_PROFILE=dir writes the Go CPU profile of each phase to
// dir/<phase>.cpu and samples PostgreSQL's busy backends' wait events
// every 10 ms during it; SCALE_PGSTAT=1 loads pg_stat_statements and logs
// the statements each phase ran, with their calls and time.
type phaseProbe struct {
	b     testing.TB
	c     *simCluster
	name  string
	db    *sql.DB
	stop  chan struct{}
	done  sync.WaitGroup
	waits map[string]int
	file  *os.File
	// sessions is how many connections PostgreSQL had accepted at the
	// start.
	sessions int64
}

// probe starts the diagnostics of phase name; its end logs them.
func (c *simCluster) probe(b testing.TB, name string) *phaseProbe {
	p := &phaseProbe{b: b, c: c, name: name, waits: map[string]int{}, stop: make(chan struct{})}
	dir := os.Getenv("SCALE_PROFILE")
	if dir == "" && os.Getenv("SCALE_PGSTAT") == "" {
		return p
	}
	db, err := sql.Open("pgx", c.pg.DSN)
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	p.db = db
	p.sessions = p.sessionCount()
	if os.Getenv("SCALE_PGSTAT") != "" {
		if _, err := db.Exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			b.Fatal(err)
		}
		if _, err := db.Exec("SELECT pg_stat_statements_reset()"); err != nil {
			b.Fatal(err)
		}
	}
	if dir != "" {
		f, err := os.Create(filepath.Join(dir, name+".cpu"))
		if err != nil {
			b.Fatal(err)
		}
		p.file = f
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		p.done.Add(1)
		go p.sample()
	}
	return p
}

// sessionCount is how many connections PostgreSQL accepted so far.
func (p *phaseProbe) sessionCount() int64 {
	var n int64
	p.db.QueryRow("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").Scan(&n)
	return n
}

// sample counts the wait events of the busy backends but its own.
func (p *phaseProbe) sample() {
	defer p.done.Done()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		rows, err := p.db.Query(`SELECT COALESCE(wait_event_type, 'CPU') || ':' || COALESCE(wait_event, '-') FROM pg_stat_activity
			WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()`)
		if err != nil {
			continue
		}
		for rows.Next() {
			var w string
			if rows.Scan(&w) == nil {
				p.waits[w]++
			}
		}
		rows.Close()
	}
}

// end stops the diagnostics and logs them; ops is how many operations
// the phase made, for the statements' calls per operation.
func (p *phaseProbe) end(ops int) {
	if p.db == nil {
		return
	}
	defer p.db.Close()
	close(p.stop)
	p.done.Wait()
	p.b.Logf("%s: %d new connections to PostgreSQL, %d ops", p.name, p.sessionCount()-p.sessions, ops)
	if p.file != nil {
		pprof.StopCPUProfile()
		p.file.Close()
		var ws []string
		total := 0
		for w, n := range p.waits {
			ws = append(ws, fmt.Sprintf("%6d  %s", n, w))
			total += n
		}
		sort.Sort(sort.Reverse(sort.StringSlice(ws)))
		p.b.Logf("%s: %d samples of busy backends' wait events (every 10 ms):\n%s", p.name, total, strings.Join(ws, "\n"))
	}
	if os.Getenv("SCALE_PGSTAT") == "" {
		return
	}
	rows, err := p.db.QueryContext(context.Background(), `SELECT calls, total_exec_time, left(regexp_replace(query, '\s+', ' ', 'g'), 110)
		FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%' ORDER BY total_exec_time DESC LIMIT 12`)
	if err != nil {
		p.b.Logf("%s: pg_stat_statements: %v", p.name, err)
		return
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var calls int
		var total float64
		var q string
		if rows.Scan(&calls, &total, &q) == nil {
			out = append(out, fmt.Sprintf("%7d calls (%.2f per op) %9.1f ms (%.3f ms each)  %s", calls, float64(calls)/float64(max(ops, 1)), total, total/float64(max(calls, 1)), q))
		}
	}
	p.b.Logf("%s: statements, %d ops:\n%s", p.name, ops, strings.Join(out, "\n"))
}
