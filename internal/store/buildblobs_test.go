package store

import (
	"context"
	"slices"
	"testing"
)

// A build's blobs are named while the build exists and has not failed;
// deleting its template releases those no other build of the team uses;
// every lookup is the team's, and no team matches nothing.
func TestBuildBlobs(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTemplate(ctx, Template{ID: "tpl1", TeamID: "team1", CreatedAt: t0})
		s.CreateTemplate(ctx, Template{ID: "tpl2", TeamID: "team1", CreatedAt: t0})
		s.CreateTemplate(ctx, Template{ID: "tpl3", TeamID: "team2", CreatedAt: t0})
		for _, b := range []Build{newBuild("b1", "tpl1", t0), newBuild("b2", "tpl2", t0), newBuild("b3", "tpl3", t0), newBuild("bad", "tpl2", t0)} {
			if err := s.CreateBuild(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.UpdateBuild(ctx, "bad", func(b *Build) error { b.Status = BuildError; return nil }); err != nil {
			t.Fatal(err)
		}
		for _, b := range []BuildBlob{
			{BuildID: "b1", TeamID: "team1", Digest: "sha256:img1", Kind: BlobImage, CreatedAt: t0},
			{BuildID: "b1", TeamID: "team1", Digest: "sha256:shared", Kind: BlobLayer, CreatedAt: t0},
			{BuildID: "b1", TeamID: "team1", Digest: "sha256:only1", Kind: BlobLayer, CreatedAt: t0},
			{BuildID: "b1", TeamID: "team1", Digest: "sha256:only1", Kind: BlobLayer, CreatedAt: t0}, // again: no error
			{BuildID: "b2", TeamID: "team1", Digest: "sha256:shared", Kind: BlobLayer, CreatedAt: t0},
			{BuildID: "bad", TeamID: "team1", Digest: "sha256:failed", Kind: BlobLayer, CreatedAt: t0},
			{BuildID: "b3", TeamID: "team2", Digest: "sha256:only1", Kind: BlobLayer, CreatedAt: t0}, // the same bytes, another team's
		} {
			if err := s.AddBuildBlob(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddBuildBlob(ctx, BuildBlob{BuildID: "b1", TeamID: "", Digest: "sha256:x", Kind: BlobLayer}); err == nil {
			t.Error("a blob of no team was recorded")
		}
		if err := s.AddBuildBlob(ctx, BuildBlob{BuildID: "b1", TeamID: "team1", Digest: "sha256:x", Kind: "other"}); err == nil {
			t.Error("a blob of an unknown kind was recorded")
		}
		digestsOf := func(bs []BuildBlob) []string {
			var out []string
			for _, b := range bs {
				out = append(out, b.Digest)
			}
			slices.Sort(out)
			return slices.Compact(out)
		}
		if got, err := s.BuildBlobs(ctx, "team1", "b1"); err != nil || !slices.Equal(digestsOf(got), []string{"sha256:img1", "sha256:only1", "sha256:shared"}) {
			t.Errorf("b1's blobs: %+v %v", got, err)
		}
		for _, team := range []string{"", "team2"} {
			if got, err := s.BuildBlobs(ctx, team, "b1"); err != nil || len(got) != 0 {
				t.Errorf("b1's blobs for team %q: %+v %v", team, got, err)
			}
		}
		if _, err := s.TeamBuildBlobs(ctx, ""); err == nil {
			t.Error("TeamBuildBlobs of no team did not fail")
		}
		if _, err := s.ReleaseBuildBlobs(ctx, ""); err == nil {
			t.Error("ReleaseBuildBlobs of no team did not fail")
		}
		if got, err := s.TeamBuildBlobs(ctx, "team1"); err != nil || !slices.Equal(digestsOf(got), []string{"sha256:img1", "sha256:only1", "sha256:shared"}) {
			t.Errorf("team1's named blobs (the failed build's not among them): %+v %v", got, err)
		}

		// tpl1 deleted: its own blobs are released, the shared one and the
		// other team's copy are not; the failed build's go too.
		if err := s.DeleteTemplate(ctx, "tpl1"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.ReleaseBuildBlobs(ctx, "team1"); err != nil || !slices.Equal(sorted(got), []string{"sha256:failed", "sha256:img1", "sha256:only1"}) {
			t.Errorf("released after tpl1's delete: %v %v", got, err)
		}
		if got, err := s.ReleaseBuildBlobs(ctx, "team1"); err != nil || len(got) != 0 {
			t.Errorf("released again: %v %v", got, err)
		}
		if got, err := s.TeamBuildBlobs(ctx, "team1"); err != nil || !slices.Equal(digestsOf(got), []string{"sha256:shared"}) {
			t.Errorf("team1's named blobs after the delete: %+v %v", got, err)
		}
		if got, err := s.TeamBuildBlobs(ctx, "team2"); err != nil || !slices.Equal(digestsOf(got), []string{"sha256:only1"}) {
			t.Errorf("team2's named blobs: %+v %v", got, err)
		}
		if err := s.DeleteTemplate(ctx, "tpl2"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.ReleaseBuildBlobs(ctx, "team1"); err != nil || !slices.Equal(got, []string{"sha256:shared"}) {
			t.Errorf("released after tpl2's delete: %v %v", got, err)
		}
	})
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
