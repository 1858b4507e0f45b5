package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"
)

// pgAdminDSN reaches the local PostgreSQL that `make test` installs and
// starts (scripts/install-deps.sh); WARREN_TEST_POSTGRES overrides it.
func pgAdminDSN() string {
	if v := os.Getenv("WARREN_TEST_POSTGRES"); v != "" {
		return v
	}
	return "host=/var/run/postgresql user=root dbname=postgres sslmode=disable"
}

// backends opens a fresh, empty store of each kind.
func backends(t *testing.T) map[string]Store {
	t.Helper()
	ctx := context.Background()
	out := map[string]Store{}
	lite, err := OpenSQLite(ctx, filepath.Join(t.TempDir(), "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lite.Close() })
	out["sqlite"] = lite

	dsn, ok := freshPostgres(t)
	if !ok {
		return out
	}
	pg, err := OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	out["postgres"] = pg
	return out
}

// freshPostgres creates an empty PostgreSQL database, dropped when the
// test ends, and returns its DSN; ok is false (with the reason logged)
// when PostgreSQL is not reachable outside CI.
func freshPostgres(t *testing.T) (dsn string, ok bool) {
	t.Helper()
	ctx := context.Background()
	admin, err := sql.Open("pgx", pgAdminDSN())
	if err == nil {
		err = admin.PingContext(ctx)
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("PostgreSQL is required in CI (make test starts it): %v", err)
		}
		t.Logf("skipping PostgreSQL: not reachable at %q: %v", pgAdminDSN(), err)
		return "", false
	}
	var b [6]byte
	rand.Read(b[:])
	name := "warren_test_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the cleanups of stores opened
	// on the database.
	t.Cleanup(func() {
		admin.ExecContext(context.Background(), "DROP DATABASE "+name)
		admin.Close()
	})
	return pgAdminDSN() + " dbname=" + name, true
}

func forEach(t *testing.T, f func(t *testing.T, s Store)) {
	for name, s := range backends(t) {
		t.Run(name, func(t *testing.T) { f(t, s) })
	}
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestTeamsAndKeys(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		if err := s.CreateTeam(ctx, Team{ID: "team1", Name: "default", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateTeam(ctx, Team{ID: "team1", Name: "again", CreatedAt: t0}); !errors.Is(err, ErrConflict) {
			t.Errorf("duplicate team: %v", err)
		}
		got, err := s.GetTeam(ctx, "team1")
		if err != nil || got.Name != "default" || !got.CreatedAt.Equal(t0) {
			t.Errorf("GetTeam = %+v %v", got, err)
		}
		if _, err := s.GetTeam(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("missing team: %v", err)
		}
		k := Key{ID: "k1", TeamID: "team1", Kind: KindAPIKey, Name: "first", Hash: "h1", Mask: "e2b_ab…yz", ValueLength: 40, CreatedAt: t0}
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateKey(ctx, Key{ID: "k2", TeamID: "team1", Kind: KindAPIKey, Hash: "h1", CreatedAt: t0}); !errors.Is(err, ErrConflict) {
			t.Errorf("duplicate hash: %v", err)
		}
		if err := s.CreateKey(ctx, Key{ID: "t1", TeamID: "team1", Kind: KindAccessToken, Hash: "h1", CreatedAt: t0}); err != nil {
			t.Errorf("same hash of another kind: %v", err)
		}
		if got, err := s.KeyByHash(ctx, KindAPIKey, "h1"); err != nil || got != k {
			t.Errorf("KeyByHash = %+v %v", got, err)
		}
		if _, err := s.KeyByHash(ctx, KindAPIKey, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown hash: %v", err)
		}
		if keys, err := s.ListKeys(ctx, "team1"); err != nil || len(keys) != 2 {
			t.Errorf("ListKeys = %v %v", keys, err)
		}
		// Renames and deletes are the team's: another team's key, or no
		// team, touches nothing.
		if err := s.CreateTeam(ctx, Team{ID: "team2", Name: "other", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if keys, err := s.ListKeys(ctx, ""); err != nil || len(keys) != 0 {
			t.Errorf("ListKeys of no team = %v %v", keys, err)
		}
		for _, team := range []string{"team2", ""} {
			if err := s.RenameKey(ctx, team, "k1", "stolen"); !errors.Is(err, ErrNotFound) {
				t.Errorf("rename by team %q: %v", team, err)
			}
			if err := s.DeleteKey(ctx, team, "k1"); !errors.Is(err, ErrNotFound) {
				t.Errorf("delete by team %q: %v", team, err)
			}
		}
		if got, err := s.KeyByHash(ctx, KindAPIKey, "h1"); err != nil || got != k {
			t.Errorf("after another team's attempts: %+v %v", got, err)
		}
		if err := s.RenameKey(ctx, "team1", "k1", "renamed"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.KeyByHash(ctx, KindAPIKey, "h1"); err != nil || got.Name != "renamed" {
			t.Errorf("renamed: %+v %v", got, err)
		}
		if err := s.RenameKey(ctx, "team1", "nope", "x"); !errors.Is(err, ErrNotFound) {
			t.Errorf("rename of a missing key: %v", err)
		}
		if err := s.DeleteKey(ctx, "team1", "k1"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteKey(ctx, "team1", "k1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("second delete: %v", err)
		}
	})
}

func sandbox(id string, started time.Time, meta map[string]string) Sandbox {
	yes := true
	return Sandbox{
		ID: id, TeamID: "team1", TemplateID: "base", Alias: "base", State: StateRunning,
		StartedAt: started, EndAt: started.Add(5 * time.Minute), CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024,
		EnvdVersion: "0.6.4", EnvdAccessToken: "tok", TrafficAccessToken: "traffic", Metadata: meta,
		EnvVars: map[string]string{"A": "1"}, AllowInternetAccess: &yes, Secure: true,
		Node: "node1", Slot: "wrn-3", Runtime: "runsc", Extra: `{"network":{}}`,
		Image: `{"layers":["base"]}`, AutoPauseMemory: true,
	}
}

func TestSandboxLifecycle(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0})
		sb := sandbox("sb1", t0, map[string]string{"k": "v"})
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSandbox(ctx, sb); !errors.Is(err, ErrConflict) {
			t.Errorf("duplicate sandbox: %v", err)
		}
		got, err := s.GetSandbox(ctx, "sb1")
		if err != nil {
			t.Fatal(err)
		}
		got.UpdatedAt = time.Time{}
		if !reflect.DeepEqual(got, sb) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, sb)
		}
		upd, err := s.UpdateSandbox(ctx, "sb1", func(x *Sandbox) error {
			x.State = StatePaused
			x.PausedAt = t0.Add(time.Minute)
			x.EndAt = t0.Add(time.Hour)
			x.AllowInternetAccess = nil
			x.RootfsDir, x.Checkpoint = "/data/sandboxes/sb1", "/data/sandboxes/sb1/checkpoint"
			x.PausedBlob = "sha256:00ff"
			x.AutoPauseMemory = false
			return nil
		})
		if err != nil || upd.State != StatePaused {
			t.Fatalf("UpdateSandbox = %+v %v", upd, err)
		}
		got, _ = s.GetSandbox(ctx, "sb1")
		if got.State != StatePaused || !got.PausedAt.Equal(t0.Add(time.Minute)) || !got.EndAt.Equal(t0.Add(time.Hour)) || got.AllowInternetAccess != nil || got.Metadata["k"] != "v" {
			t.Errorf("after update %+v", got)
		}
		if got.PausedBlob != "sha256:00ff" {
			t.Errorf("paused blob: %q", got.PausedBlob)
		}
		if got.RootfsDir != "/data/sandboxes/sb1" || got.Checkpoint != "/data/sandboxes/sb1/checkpoint" || got.AutoPauseMemory || got.Image != `{"layers":["base"]}` {
			t.Errorf("where the paused sandbox is kept: %q %q, autoPauseMemory %v, image %q", got.RootfsDir, got.Checkpoint, got.AutoPauseMemory, got.Image)
		}
		boom := errors.New("boom")
		if _, err := s.UpdateSandbox(ctx, "sb1", func(x *Sandbox) error { x.State = StateKilled; return boom }); !errors.Is(err, boom) {
			t.Errorf("aborted update: %v", err)
		}
		if got, _ := s.GetSandbox(ctx, "sb1"); got.State != StatePaused {
			t.Error("an aborted update was written")
		}
		if _, err := s.UpdateSandbox(ctx, "nope", func(*Sandbox) error { return nil }); !errors.Is(err, ErrNotFound) {
			t.Errorf("update of missing: %v", err)
		}
		if exp, err := s.ExpiredSandboxes(ctx, t0.Add(2*time.Hour)); err != nil || len(exp) != 1 {
			t.Errorf("ExpiredSandboxes = %v %v", exp, err)
		}
		if exp, _ := s.ExpiredSandboxes(ctx, t0.Add(30*time.Minute)); len(exp) != 0 {
			t.Errorf("not yet expired, got %v", exp)
		}
		if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetSandbox(ctx, "sb1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("after delete: %v", err)
		}
	})
}

func TestConcurrentUpdatesSerialise(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0})
		s.CreateSandbox(ctx, sandbox("sb", t0, nil))
		var wg sync.WaitGroup
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.UpdateSandbox(ctx, "sb", func(x *Sandbox) error {
					x.CPUCount++
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if got, _ := s.GetSandbox(ctx, "sb"); got.CPUCount != 22 {
			t.Errorf("CPUCount = %d after 20 increments from 2: lost updates", got.CPUCount)
		}
	})
}

func TestListSandboxesFiltersAndPages(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0})
		s.CreateTeam(ctx, Team{ID: "team2", Name: "u", CreatedAt: t0})
		for i := 0; i < 10; i++ {
			meta := map[string]string{"parity": []string{"even", "odd"}[i%2]}
			sb := sandbox(fmt.Sprintf("sb%02d", i), t0.Add(time.Duration(i/2)*time.Second), meta) // pairs share a start time
			if i == 9 {
				sb.State = StatePaused
			}
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		other := sandbox("other", t0, nil)
		other.TeamID = "team2"
		s.CreateSandbox(ctx, other)

		var seen []string
		var after *Cursor
		for page := 0; page < 10; page++ {
			got, err := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), Limit: 3, After: after})
			if err != nil {
				t.Fatal(err)
			}
			for _, sb := range got {
				seen = append(seen, sb.ID)
			}
			if len(got) < 3 {
				break
			}
			last := got[len(got)-1]
			after = &Cursor{StartedAt: last.StartedAt, ID: last.ID}
		}
		if fmt.Sprint(seen) != "[sb00 sb01 sb02 sb03 sb04 sb05 sb06 sb07 sb08 sb09]" {
			t.Errorf("pages gave %v", seen)
		}
		desc, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), Desc: true, Limit: 2})
		if len(desc) != 2 || desc[0].ID != "sb09" || desc[1].ID != "sb08" {
			t.Errorf("desc: %v", ids(desc))
		}
		odd, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), Metadata: map[string]string{"parity": "odd"}, Limit: 3})
		if fmt.Sprint(ids(odd)) != "[sb01 sb03 sb05]" {
			t.Errorf("metadata filter: %v", ids(odd))
		}
		paused, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), States: []SandboxState{StatePaused}})
		if fmt.Sprint(ids(paused)) != "[sb09]" {
			t.Errorf("state filter: %v", ids(paused))
		}
		late, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), StartedAfter: t0.Add(4 * time.Second)})
		if fmt.Sprint(ids(late)) != "[sb08 sb09]" {
			t.Errorf("startedAfter filter (inclusive): %v", ids(late))
		}
		s.UpdateSandbox(ctx, "sb03", func(sb *Sandbox) error { sb.TemplateID = "other-tmpl"; sb.Node = "n2"; return nil })
		byTemplate, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), TemplateID: "other-tmpl"})
		byNode, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: AllTeams(), Node: "n2"})
		if fmt.Sprint(ids(byTemplate), ids(byNode)) != "[sb03] [sb03]" {
			t.Errorf("template filter: %v, node filter: %v", ids(byTemplate), ids(byNode))
		}
	})
}

// An empty team matches no sandbox, whatever else the filter says; every
// team's are listed only when the filter says so.
func TestListSandboxesEmptyTeamMatchesNothing(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		for _, team := range []string{"team1", "team2"} {
			s.CreateTeam(ctx, Team{ID: team, Name: team, CreatedAt: t0})
			sb := sandbox("sb-"+team, t0, map[string]string{"k": "v"})
			sb.TeamID, sb.Node = team, "n1"
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		for name, f := range map[string]SandboxFilter{
			"nothing":  {},
			"a node":   {Node: "n1"},
			"states":   {States: []SandboxState{StateRunning, StatePaused}},
			"metadata": {Metadata: map[string]string{"k": "v"}},
			"a limit":  {Limit: 10},
		} {
			got, err := s.ListSandboxes(ctx, f)
			if err != nil || len(got) != 0 {
				t.Errorf("no team, %s: %v %v; want none", name, ids(got), err)
			}
			f.Teams = AllTeams()
			if got, err := s.ListSandboxes(ctx, f); err != nil || fmt.Sprint(ids(got)) != "[sb-team1 sb-team2]" {
				t.Errorf("all teams, %s: %v %v", name, ids(got), err)
			}
		}
		// ForTeam("") is no way around it.
		if got, err := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam(""), Node: "n1"}); err != nil || len(got) != 0 {
			t.Errorf(`ForTeam(""): %v %v; want none`, ids(got), err)
		}
		if got, err := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1")}); err != nil || fmt.Sprint(ids(got)) != "[sb-team1]" {
			t.Errorf("team1: %v %v", ids(got), err)
		}
	})
}

func ids(sbs []Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	return out
}

func TestMigrationsAreIdempotent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.db")
	for i := 0; i < 2; i++ {
		s, err := OpenSQLite(context.Background(), p)
		if err != nil {
			t.Fatalf("open #%d: %v", i+1, err)
		}
		s.Close()
	}
}

func TestTeamScopeCovers(t *testing.T) {
	for _, c := range []struct {
		name  string
		scope TeamScope
		team  string
		want  bool
	}{
		{"its team", ForTeam("t1"), "t1", true},
		{"another team", ForTeam("t1"), "t2", false},
		{"an empty team's resource", ForTeam("t1"), "", false},
		{"the empty team", ForTeam(""), "", false},
		{"the empty team, another's resource", ForTeam(""), "t1", false},
		{"the zero scope", TeamScope{}, "t1", false},
		{"the zero scope, an empty team's resource", TeamScope{}, "", false},
		{"all teams", AllTeams(), "t1", true},
	} {
		if got := c.scope.Covers(c.team); got != c.want {
			t.Errorf("%s: Covers(%q) = %v, want %v", c.name, c.team, got, c.want)
		}
	}
}
