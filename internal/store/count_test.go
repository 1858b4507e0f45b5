package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// CountSandboxes counts, by node, what ListSandboxes would list for the
// same filter (its page aside), on both backends; an empty team counts
// nothing.
func TestCountSandboxesMatchesList(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0})
		s.CreateTeam(ctx, Team{ID: "team2", Name: "u", CreatedAt: t0})
		for i := 0; i < 12; i++ {
			sb := sandbox(fmt.Sprintf("sb%02d", i), t0.Add(time.Duration(i)*time.Second), map[string]string{"parity": []string{"even", "odd"}[i%2]})
			sb.Node = []string{"n1", "n2", "n3"}[i%3]
			if i >= 8 {
				sb.State = StatePaused
			}
			if i == 10 { // paused on n2, its files in the blob store
				sb.PausedBlob = "sha256:" + fmt.Sprintf("%064d", i)
			}
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		other := sandbox("other", t0, nil)
		other.TeamID, other.Node = "team2", "n1"
		s.CreateSandbox(ctx, other)

		for name, f := range map[string]SandboxFilter{
			"team":          {Teams: ForTeam("team1")},
			"running":       {Teams: ForTeam("team1"), States: []SandboxState{StateRunning}},
			"paused":        {Teams: ForTeam("team1"), States: []SandboxState{StatePaused}},
			"metadata":      {Teams: ForTeam("team1"), Metadata: map[string]string{"parity": "odd"}, States: []SandboxState{StateRunning}},
			"started after": {Teams: ForTeam("team1"), StartedAfter: t0.Add(5 * time.Second)},
			"paged":         {Teams: ForTeam("team1"), Limit: 2, After: &Cursor{StartedAt: t0.Add(3 * time.Second), ID: "sb03"}},
			"all teams":     {Teams: AllTeams()},
			"on nodes":      {Teams: ForTeam("team1"), OnNodes: []string{"n1", "n3"}},
			"on no node":    {Teams: ForTeam("team1"), OnNodes: []string{}},
			"or blob store": {Teams: ForTeam("team1"), OnNodes: []string{"n1"}, OrInBlobStore: true},
			// The blob store keeps no running sandbox: the nodes alone
			// decide (the count filters its groups by node).
			"running, or blob store": {Teams: ForTeam("team1"), States: []SandboxState{StateRunning}, OnNodes: []string{"n1", "n3"}, OrInBlobStore: true},
			"running, no node":       {Teams: ForTeam("team1"), States: []SandboxState{StateRunning}, OnNodes: []string{}, OrInBlobStore: true},
			"running on nodes":       {Teams: ForTeam("team1"), States: []SandboxState{StateRunning}, OnNodes: []string{"n2"}},
			"paused, or blob store":  {Teams: ForTeam("team1"), States: []SandboxState{StatePaused}, OnNodes: []string{"n1"}, OrInBlobStore: true},
			"paused, no node":        {Teams: ForTeam("team1"), States: []SandboxState{StatePaused}, OnNodes: []string{}, OrInBlobStore: true},
			"empty team":             {},
			"empty team n1":          {Node: "n1"},
		} {
			list := f
			list.Limit, list.After = 0, nil
			recs, err := s.ListSandboxes(ctx, list)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]int{}
			for _, r := range recs {
				want[r.Node]++
			}
			got, err := s.CountSandboxes(ctx, f)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s: counted %v, listed %v", name, got, want)
			}
		}
		// A lost node's (n2's) sandboxes are left out but the one whose
		// files are in the blob store: it resumes on any node.
		on := SandboxFilter{Teams: ForTeam("team1"), OnNodes: []string{"n1", "n3"}, OrInBlobStore: true}
		if got, _ := s.CountSandboxes(ctx, on); fmt.Sprint(got) != "map[n1:4 n2:1 n3:4]" {
			t.Errorf("on n1, n3 or in the blob store: %v", got)
		}
		on.OnNodes = []string{}
		if recs, _ := s.ListSandboxes(ctx, on); len(recs) != 1 || recs[0].ID != "sb10" {
			t.Errorf("on no node but in the blob store: %v", recs)
		}
		if got, _ := s.CountSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), States: []SandboxState{StateRunning}}); fmt.Sprint(got) != "map[n1:3 n2:3 n3:2]" {
			t.Errorf("running of team1 by node: %v", got)
		}
	})
}

// Metadata is matched in SQL on both backends, for any key and value
// (quotes, dots, JSON path characters), and a page holds Limit matches.
func TestMetadataFilterInSQL(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0})
		odd := map[string]string{"a.b": "x", `k"q`: `v'"`, "$[0]": "1", "ключ": "значение"}
		for i := 0; i < 9; i++ {
			meta := map[string]string{"n": fmt.Sprint(i % 3)}
			if i == 4 {
				meta = odd
			}
			if err := s.CreateSandbox(ctx, sandbox(fmt.Sprintf("sb%02d", i), t0.Add(time.Duration(i)*time.Second), meta)); err != nil {
				t.Fatal(err)
			}
		}
		for k, v := range odd {
			got, err := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), Metadata: map[string]string{k: v}})
			if err != nil || fmt.Sprint(ids(got)) != "[sb04]" {
				t.Errorf("%q=%q: %v %v", k, v, ids(got), err)
			}
			if got, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), Metadata: map[string]string{k: v + "x"}}); len(got) != 0 {
				t.Errorf("%q=%q+x matched %v", k, v, ids(got))
			}
		}
		if got, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), Metadata: odd}); fmt.Sprint(ids(got)) != "[sb04]" {
			t.Errorf("all pairs: %v", ids(got))
		}
		page, _ := s.ListSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), Metadata: map[string]string{"n": "1"}, Limit: 2})
		if fmt.Sprint(ids(page)) != "[sb01 sb07]" {
			t.Errorf("a page of n=1: %v", ids(page))
		}
		if n, _ := s.CountSandboxes(ctx, SandboxFilter{Teams: ForTeam("team1"), Metadata: map[string]string{"n": "1"}}); fmt.Sprint(n) != "map[node1:2]" {
			t.Errorf("count of n=1: %v", n)
		}
	})
}
