package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"
)

// keptCounts is sandbox_counts, row by row ("team/state/node" → n), and
// counted the same grouping counted from sandboxes.
func keptCounts(t *testing.T, s Store) (kept, counted map[string]int) {
	t.Helper()
	db := s.(*SQL).db
	read := func(query string) map[string]int {
		rows, err := db.Query(query)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var team, state, node string
			var n int
			if err := rows.Scan(&team, &state, &node, &n); err != nil {
				t.Fatal(err)
			}
			out[team+"/"+state+"/"+node] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	return read("SELECT team_id, state, node, n FROM sandbox_counts"),
		read("SELECT team_id, state, node, COUNT(*) FROM sandboxes GROUP BY team_id, state, node")
}

// checkCounts fails the test unless the kept counts are a COUNT(*) of
// sandboxes (no row of zero kept), and CountSandboxes of each team's
// running sandboxes is what ListSandboxes lists.
func checkCounts(t *testing.T, s Store, after string) {
	t.Helper()
	kept, counted := keptCounts(t, s)
	if !maps.Equal(kept, counted) {
		t.Errorf("after %s: kept counts %v, COUNT(*) %v", after, kept, counted)
	}
	ctx := context.Background()
	for _, team := range []string{"team1", "team2"} {
		for _, states := range [][]SandboxState{{StateRunning}, {StatePaused}, {StateRunning, StatePaused}, nil} {
			f := SandboxFilter{Teams: ForTeam(team), States: states}
			recs, err := s.ListSandboxes(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]int{}
			for _, r := range recs {
				want[r.Node]++
			}
			got, err := s.CountSandboxes(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, want) {
				t.Errorf("after %s: %s's %v by node: counted %v, listed %v", after, team, states, got, want)
			}
		}
	}
}

// changeState is UpdateSandbox changing a sandbox's state.
func changeState(s Store, id string, st SandboxState) error {
	_, err := s.UpdateSandbox(context.Background(), id, func(x *Sandbox) error {
		x.State = st
		return nil
	})
	return err
}

// The counts kept per team, state and node equal a COUNT(*) of sandboxes
// after creates, pauses, resumes, kills, takeovers (a node change), a
// change of team, deletes, updates that change none of the three, and
// (PostgreSQL) a TRUNCATE.
func TestSandboxCountsFollowWrites(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0})
		s.CreateTeam(ctx, Team{ID: "team2", Name: "u", CreatedAt: t0})
		checkCounts(t, s, "nothing")
		for i := 0; i < 30; i++ {
			sb := sandbox(fmt.Sprintf("sb%02d", i), t0.Add(time.Duration(i)*time.Second), nil)
			sb.Node = []string{"n1", "n2", "n3"}[i%3]
			if i%4 == 3 {
				sb.TeamID = "team2"
			}
			if i%5 == 4 {
				sb.State = StatePaused
			}
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		checkCounts(t, s, "creates")
		// A create that fails (the ID is taken) counts nothing.
		if err := s.CreateSandbox(ctx, sandbox("sb00", t0, nil)); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate create: %v", err)
		}
		checkCounts(t, s, "a failed create")

		for i := 0; i < 12; i++ {
			if err := changeState(s, fmt.Sprintf("sb%02d", i), StatePaused); err != nil {
				t.Fatal(err)
			}
		}
		checkCounts(t, s, "pauses")
		for i := 0; i < 6; i++ {
			if err := changeState(s, fmt.Sprintf("sb%02d", i), StateRunning); err != nil {
				t.Fatal(err)
			}
		}
		checkCounts(t, s, "resumes")
		for i := 12; i < 16; i++ {
			if err := changeState(s, fmt.Sprintf("sb%02d", i), StateKilled); err != nil {
				t.Fatal(err)
			}
		}
		checkCounts(t, s, "kills")

		// Takeover: n2's sandboxes move to n4, whatever their state.
		n2, err := s.ListSandboxes(ctx, SandboxFilter{Teams: AllTeams(), Node: "n2"})
		if err != nil || len(n2) == 0 {
			t.Fatalf("n2's sandboxes: %v %v", n2, err)
		}
		for _, sb := range n2 {
			if _, err := s.UpdateSandbox(ctx, sb.ID, func(x *Sandbox) error { x.Node = "n4"; return nil }); err != nil {
				t.Fatal(err)
			}
		}
		checkCounts(t, s, "takeovers")
		// State and node at once, and a change of team.
		if _, err := s.UpdateSandbox(ctx, "sb20", func(x *Sandbox) error {
			x.State, x.Node = StatePaused, "n5"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateSandbox(ctx, "sb21", func(x *Sandbox) error { x.TeamID = "team2"; return nil }); err != nil {
			t.Fatal(err)
		}
		checkCounts(t, s, "a state and node change, a team change")
		// Updates that leave team, state and node as they were, and one
		// that aborts.
		for i := 16; i < 20; i++ {
			if _, err := s.UpdateSandbox(ctx, fmt.Sprintf("sb%02d", i), func(x *Sandbox) error {
				x.CPUCount++
				x.EndAt = x.EndAt.Add(time.Minute)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.UpdateSandbox(ctx, "sb17", func(x *Sandbox) error { x.State = StateKilled; return errors.New("no") }); err == nil {
			t.Fatal("the aborted update succeeded")
		}
		checkCounts(t, s, "updates of other columns")

		for i := 0; i < 30; i += 3 {
			if err := s.DeleteSandbox(ctx, fmt.Sprintf("sb%02d", i)); err != nil {
				t.Fatal(err)
			}
		}
		checkCounts(t, s, "deletes")
		if s.(*SQL).d == postgresDialect {
			if _, err := s.(*SQL).db.Exec("TRUNCATE sandboxes"); err != nil {
				t.Fatal(err)
			}
			checkCounts(t, s, "TRUNCATE")
		}
		for i := 0; i < 30; i++ {
			s.DeleteSandbox(ctx, fmt.Sprintf("sb%02d", i))
		}
		checkCounts(t, s, "deleting every sandbox")
		if kept, _ := keptCounts(t, s); len(kept) != 0 {
			t.Errorf("rows left with no sandbox: %v", kept)
		}
	})
}

// Concurrent writers (20 goroutines creating, pausing, resuming, moving
// and deleting sandboxes of two teams on the same few nodes, so that they
// meet on the same counter rows) leave the counts equal to COUNT(*), and
// none of them fails (a deadlock between a pause and a resume, or with a
// create's route sequence, would fail one on PostgreSQL).
func TestSandboxCountsConcurrentWriters(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0})
		s.CreateTeam(ctx, Team{ID: "team2", Name: "u", CreatedAt: t0})
		const writers, each = 20, 6
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- concurrentWriter(s, w, each)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		checkCounts(t, s, fmt.Sprintf("%d concurrent writers", writers))
		if kept, _ := keptCounts(t, s); len(kept) == 0 {
			t.Error("no counts kept: the writers left no sandbox")
		}
	})
}

// concurrentWriter is writer w's share of TestSandboxCountsConcurrentWriters:
// each sandbox is created, paused, resumed (or killed), moved to another
// node, and every other one deleted.
func concurrentWriter(s Store, w, each int) error {
	ctx := context.Background()
	nodes := []string{"n1", "n2"}
	for i := 0; i < each; i++ {
		id := fmt.Sprintf("w%02d-%d", w, i)
		sb := sandbox(id, t0.Add(time.Duration(w*each+i)*time.Millisecond), nil)
		sb.TeamID = []string{"team1", "team2"}[w%2]
		sb.Node = nodes[(w+i)%2]
		if err := s.CreateSandbox(ctx, sb); err != nil {
			return fmt.Errorf("create %s: %w", id, err)
		}
		if err := changeState(s, id, StatePaused); err != nil {
			return fmt.Errorf("pause %s: %w", id, err)
		}
		next := StateRunning
		if i%3 == 2 {
			next = StateKilled
		}
		if err := changeState(s, id, next); err != nil {
			return fmt.Errorf("%s %s: %w", next, id, err)
		}
		if _, err := s.UpdateSandbox(ctx, id, func(x *Sandbox) error { x.Node = nodes[(w+i+1)%2]; return nil }); err != nil {
			return fmt.Errorf("move %s: %w", id, err)
		}
		if i%2 == 1 {
			if err := s.DeleteSandbox(ctx, id); err != nil {
				return fmt.Errorf("delete %s: %w", id, err)
			}
		}
	}
	return nil
}

// A team's count never includes another team's sandboxes, whatever the
// team IDs share, and a filter without a team counts nothing.
func TestSandboxCountsPerTeam(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		for _, team := range []string{"team1", "team10", "team2"} {
			s.CreateTeam(ctx, Team{ID: team, Name: team, CreatedAt: t0})
		}
		for i, team := range []string{"team1", "team10", "team10", "team2", "team2", "team2"} {
			sb := sandbox(fmt.Sprintf("sb%d", i), t0, nil)
			sb.TeamID = team
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		running := []SandboxState{StateRunning}
		for team, want := range map[string]string{"team1": "map[node1:1]", "team10": "map[node1:2]", "team2": "map[node1:3]", "team": "map[]", "team3": "map[]"} {
			got, err := s.CountSandboxes(ctx, SandboxFilter{Teams: ForTeam(team), States: running})
			if err != nil || fmt.Sprint(got) != want {
				t.Errorf("%s's running: %v %v, want %s", team, got, err, want)
			}
		}
		for name, f := range map[string]SandboxFilter{
			"zero filter":          {},
			"empty team":           {Teams: ForTeam("")},
			"empty team, running":  {Teams: ForTeam(""), States: running},
			"empty team, its node": {Teams: ForTeam(""), States: running, Node: "node1"},
			"empty team, on nodes": {Teams: ForTeam(""), States: running, OnNodes: []string{"node1"}},
		} {
			if got, err := s.CountSandboxes(ctx, f); err != nil || len(got) != 0 {
				t.Errorf("%s: %v %v, want nothing", name, got, err)
			}
		}
	})
}

// Migration 0031 fills the counts from the sandboxes already there.
func TestSandboxCountsFilledByMigration(t *testing.T) {
	for kind, b := range blankDatabases(t) {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			if err := migrate(ctx, b.db, b.d, migrationsUpTo(t, 30), b.locker()); err != nil {
				t.Fatal(err)
			}
			before := &SQL{db: b.db, d: b.d}
			before.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0})
			before.CreateTeam(ctx, Team{ID: "team2", Name: "u", CreatedAt: t0})
			for i := 0; i < 20; i++ {
				sb := sandbox(fmt.Sprintf("sb%02d", i), t0, nil)
				sb.TeamID = []string{"team1", "team2"}[i%2]
				sb.State = []SandboxState{StateRunning, StatePaused, StateKilled}[i%3]
				sb.Node = []string{"n1", "n2", "n3", "n4"}[i%4]
				if err := before.CreateSandbox(ctx, sb); err != nil {
					t.Fatal(err)
				}
			}
			s, err := b.open(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			kept, counted := keptCounts(t, s)
			if len(kept) == 0 || !maps.Equal(kept, counted) {
				t.Errorf("filled counts %v, COUNT(*) %v", kept, counted)
			}
			checkCounts(t, s, "the migration")
		})
	}
}

// The kept counts answer one team's sandboxes by state and node; any
// other term (or every team) is counted from the sandboxes.
func TestKeptCountsAnswer(t *testing.T) {
	yes := []SandboxFilter{
		{Teams: ForTeam("t")},
		{Teams: ForTeam("t"), States: []SandboxState{StateRunning}},
		{Teams: ForTeam("t"), States: []SandboxState{StateRunning, StatePaused}, Node: "n1"},
		{Teams: ForTeam("t"), Limit: 10, After: &Cursor{ID: "x"}, Desc: true},
	}
	no := []SandboxFilter{
		{},
		{Teams: ForTeam("")},
		{Teams: AllTeams()},
		{Teams: ForTeam("t"), Metadata: map[string]string{"k": "v"}},
		{Teams: ForTeam("t"), TemplateID: "base"},
		{Teams: ForTeam("t"), StartedAfter: t0},
		{Teams: ForTeam("t"), OnNodes: []string{"n1"}, OrInBlobStore: true},
	}
	for i, f := range yes {
		if !f.keptCountsAnswer() {
			t.Errorf("yes[%d] %+v: not answered by the kept counts", i, f)
		}
	}
	for i, f := range no {
		if f.keptCountsAnswer() {
			t.Errorf("no[%d] %+v: answered by the kept counts", i, f)
		}
	}
}
