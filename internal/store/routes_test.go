package store

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

func routeIDs(rs []SandboxRoute) string {
	var s []string
	for _, r := range rs {
		s = append(s, fmt.Sprintf("%s:%s:%v", r.ID, r.State, r.AutoResume))
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

func TestSandboxRoutesFollowChanges(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		if err := s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a", "b", "gone"} {
			sb := sandbox(id, t0, nil)
			if id == "gone" {
				sb.State = StateKilled
			}
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		all, seq, err := s.SandboxRoutes(ctx, 0)
		if err != nil || routeIDs(all) != "a:running:false b:running:false" || seq <= 0 {
			t.Fatalf("first read: %s seq %d %v", routeIDs(all), seq, err)
		}
		if rs, next, err := s.SandboxRoutes(ctx, seq); err != nil || len(rs) != 0 || next != seq {
			t.Fatalf("nothing changed: %s %d %v", routeIDs(rs), next, err)
		}
		// Changes that do not touch routing are not reported.
		if _, err := s.UpdateSandbox(ctx, "a", func(sb *Sandbox) error { sb.EndAt = sb.EndAt.Add(1); return nil }); err != nil {
			t.Fatal(err)
		}
		if rs, _, _ := s.SandboxRoutes(ctx, seq); len(rs) != 0 {
			t.Errorf("a timeout change reported: %s", routeIDs(rs))
		}
		if _, err := s.UpdateSandbox(ctx, "a", func(sb *Sandbox) error { sb.State = StatePaused; sb.AutoResume = true; return nil }); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSandbox(ctx, sandbox("c", t0, nil)); err != nil {
			t.Fatal(err)
		}
		rs, next, err := s.SandboxRoutes(ctx, seq)
		if err != nil || routeIDs(rs) != "a:paused:true c:running:false" || next != seq+2 {
			t.Fatalf("after two changes: %s %d (from %d) %v", routeIDs(rs), next, seq, err)
		}
		// Concurrent writers: every change is seen, none twice.
		seq = next
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.CreateSandbox(ctx, sandbox(fmt.Sprint("p", i), t0, nil)); err != nil {
					t.Error(err)
				}
			}()
		}
		seen := map[string]int{}
		deadline := time.Now().Add(10 * time.Second)
		for {
			rs, next, err := s.SandboxRoutes(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				seen[r.ID]++
			}
			seq = next
			if len(seen) == 20 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("saw %d of 20 in 10 s", len(seen))
			}
			time.Sleep(time.Millisecond)
		}
		wg.Wait()
		for id, n := range seen {
			if n != 1 {
				t.Errorf("%s seen %d times", id, n)
			}
		}
	})
}
