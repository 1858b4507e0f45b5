package store

import (
	"context"
	"errors"
	"testing"
)

// A snapshot's blob record is found by its team only (an empty team or
// another team's finds nothing), is unique per build, and goes with its
// template.
func TestSnapshotBlobs(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "a", CreatedAt: t0})
		if err := s.CreateTemplate(ctx, Template{ID: "snap", TeamID: "team1", SnapshotOf: "sbx", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateBuild(ctx, Build{ID: "b1", TemplateID: "snap", Status: BuildReady, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		rec := SnapshotBlob{BuildID: "b1", TeamID: "team1", Blob: "sha256:aa", Image: `{"layers":["l"]}`, Size: 42, CreatedAt: t0}
		if err := s.PutSnapshotBlob(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if err := s.PutSnapshotBlob(ctx, rec); !errors.Is(err, ErrConflict) {
			t.Errorf("a second record of one build: %v", err)
		}
		if err := s.PutSnapshotBlob(ctx, SnapshotBlob{BuildID: "b2", Blob: "sha256:bb"}); err == nil {
			t.Errorf("a record of no team was taken")
		}
		got, err := s.GetSnapshotBlob(ctx, "team1", "b1")
		if err != nil || got != rec {
			t.Errorf("GetSnapshotBlob = %+v, %v; want %+v", got, err, rec)
		}
		for _, team := range []string{"", "team2"} {
			if _, err := s.GetSnapshotBlob(ctx, team, "b1"); !errors.Is(err, ErrNotFound) {
				t.Errorf("team %q reads team1's snapshot blob: %v", team, err)
			}
			if err := s.DeleteSnapshotBlob(ctx, team, "b1"); err != nil {
				t.Fatal(err)
			}
		}
		if all, err := s.ListSnapshotBlobs(ctx); err != nil || len(all) != 1 || all[0] != rec {
			t.Errorf("ListSnapshotBlobs = %+v, %v (another team's delete removed it?)", all, err)
		}
		if err := s.DeleteTemplate(ctx, "snap"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetSnapshotBlob(ctx, "team1", "b1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("the record outlived its template: %v", err)
		}
		rec.BuildID = "b3"
		s.PutSnapshotBlob(ctx, rec)
		if err := s.DeleteSnapshotBlob(ctx, "team1", "b3"); err != nil {
			t.Fatal(err)
		}
		if all, err := s.ListSnapshotBlobs(ctx); err != nil || len(all) != 0 {
			t.Errorf("after the deletes: %+v, %v", all, err)
		}
	})
}
