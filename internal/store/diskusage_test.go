package store

import (
	"context"
	"testing"
)

// A team's disk usage sums its volumes' quotas, its paused sandboxes'
// files and its templates' images; a row counts only while its owner is
// the team's and still holds the disk (paused, existing).
func TestTeamDiskUsage(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "a", CreatedAt: t0})
		s.CreateTeam(ctx, Team{ID: "team2", Name: "b", CreatedAt: t0})
		s.CreateVolume(ctx, volume("v1", "team1", "data"))      // 64 MB
		s.CreateVolume(ctx, volume("v2", "team2", "elsewhere")) // another team's
		paused := sandbox("sbx-p", t0, nil)
		paused.TeamID, paused.State = "team1", StatePaused
		running := sandbox("sbx-r", t0, nil)
		running.TeamID, running.State = "team1", StateRunning
		for _, x := range []Sandbox{paused, running} {
			if err := s.CreateSandbox(ctx, x); err != nil {
				t.Fatal(err)
			}
		}
		for _, tp := range []Template{{ID: "tpl", TeamID: "team1", CreatedAt: t0}, {ID: "snap", TeamID: "team1", SnapshotOf: "sbx-p", CreatedAt: t0}} {
			if err := s.CreateTemplate(ctx, tp); err != nil {
				t.Fatal(err)
			}
		}
		for _, u := range []DiskUse{
			{Kind: DiskPaused, ObjectID: "sbx-p", TeamID: "team1", Bytes: 1000},
			{Kind: DiskPaused, ObjectID: "sbx-r", TeamID: "team1", Bytes: 7},      // resumed since: not counted
			{Kind: DiskTemplate, ObjectID: "tpl", TeamID: "team1", Bytes: 50},     // replaced below
			{Kind: DiskTemplate, ObjectID: "tpl", TeamID: "team1", Bytes: 200},    // its latest build
			{Kind: DiskTemplate, ObjectID: "gone", TeamID: "team1", Bytes: 99999}, // deleted: not counted
			{Kind: DiskSnapshot, ObjectID: "snap", TeamID: "team1", Bytes: 30},
			{Kind: DiskTemplate, ObjectID: "tpl", TeamID: "team2", Bytes: 200}, // the row names a team; the template's decides
		} {
			if err := s.SetDiskUse(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.TeamDiskUsage(ctx, "team1")
		want := TeamDisk{Volumes: 64 << 20, Paused: 1000, Templates: 200, Snapshots: 30}
		if err != nil || got != want {
			t.Errorf("team1's usage = %+v %v, want %+v", got, err, want)
		}
		if got, err := s.TeamDiskUsage(ctx, "team2"); err != nil || got != (TeamDisk{Volumes: 64 << 20}) {
			t.Errorf("team2's usage = %+v %v", got, err)
		}
		if _, err := s.TeamDiskUsage(ctx, ""); err == nil {
			t.Error("the usage of no team was answered")
		}
		if err := s.SetDiskUse(ctx, DiskUse{Kind: DiskPaused, ObjectID: "x"}); err == nil {
			t.Error("a use without a team was recorded")
		}
		if err := s.DeleteTemplate(ctx, "tpl"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.TeamDiskUsage(ctx, "team1"); got.Templates != 0 {
			t.Errorf("a deleted template still counts %d bytes", got.Templates)
		}
	})
}
