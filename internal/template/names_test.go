package template

import (
	"context"
	"errors"
	"testing"

	"github.com/warren-sandbox/warren/internal/store"
)

// TestTemplateNamesArePerTeam: a name belongs to the caller's team; the
// same name in two teams just works, and another team's private name
// answers exactly as a name nobody has (no 403 or 409 that reveals it).
// "team/name" reaches another team's public template, never a private
// one; a bare name never reaches another team's.
func TestTemplateNamesArePerTeam(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	addTeam(t, st, "t2")
	b := newUploadBuilder(t, st, t.TempDir())

	a1 := newTemplate(t, b, "t1", "app")
	a2, err := b.Create(ctx, CreateRequest{TeamID: "t2", Name: "app"})
	if err != nil {
		t.Fatalf("t2 building a name t1 has: %v", err)
	}
	if a1.Template.ID == a2.Template.ID {
		t.Fatal("t2's build went into t1's template")
	}
	for team, want := range map[string]string{"t1": a1.Template.ID, "t2": a2.Template.ID} {
		for _, ref := range []string{"app", team + "/app", "any-ns/app"} {
			got, err := b.Get(ctx, team, ref)
			if err != nil || got.ID != want {
				t.Errorf("%s's %q = %q %v, want %s", team, ref, got.ID, err, want)
			}
		}
	}

	// t1's private template: to t2 it is a name nobody has.
	secret := newTemplate(t, b, "t1", "secret")
	for _, ref := range []string{"secret", "t1/secret"} {
		if _, err := b.Alias(ctx, "t2", ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("t2's alias %q: %v, want not found", ref, err)
		}
		if _, err := b.Get(ctx, "t2", ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("t2's get %q: %v, want not found", ref, err)
		}
	}
	if got, err := b.Alias(ctx, "t1", "secret"); err != nil || got.ID != secret.Template.ID {
		t.Errorf("t1's own alias: %q %v", got.ID, err)
	}

	// Published: reachable as t1/pub, not as pub (no squatting a bare
	// name another team would use).
	pub := newTemplate(t, b, "t1", "pub")
	if _, err := st.UpdateTemplate(ctx, pub.Template.ID, func(x *store.Template) error { x.Public = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, "t2", "t1/pub"); err != nil || got.ID != pub.Template.ID {
		t.Errorf("t2's t1/pub: %q %v", got.ID, err)
	}
	if got, err := b.Alias(ctx, "t2", "t1/pub"); err != nil || got.ID != pub.Template.ID || !got.Public {
		t.Errorf("t2's alias t1/pub: %+v %v", got, err)
	}
	if _, err := b.Get(ctx, "t2", "pub"); !errors.Is(err, ErrNotFound) {
		t.Errorf("t2's bare pub: %v, want not found", err)
	}
	// t2's own pub wins over t1's for t2, even with t1's namespace absent.
	own := newTemplate(t, b, "t2", "pub")
	if got, err := b.Get(ctx, "t2", "pub"); err != nil || got.ID != own.Template.ID {
		t.Errorf("t2's own pub: %q %v", got.ID, err)
	}
	// An empty team finds nothing.
	if _, err := b.Get(ctx, "", "app"); !errors.Is(err, ErrNotFound) {
		t.Errorf("no team's app: %v", err)
	}
}

// TestTagByBuildID: where no tag has the name, "name:buildID" names one
// of the template's ready builds, as in E2B (its dashboard assigns tags
// with such targets); a build still running, or another template's, is
// not found.
func TestTagByBuildID(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	b := newUploadBuilder(t, st, t.TempDir())
	app := newTemplate(t, b, "t1", "app")
	other := newTemplate(t, b, "t1", "other")
	ready := func(id string) {
		if _, err := st.UpdateBuild(ctx, id, func(bd *store.Build) error { bd.Status = store.BuildReady; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.AssignTags(ctx, "t1", "app:"+app.BuildID, []string{"v1"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("a build not ready yet: %v, want not found", err)
	}
	ready(app.BuildID)
	ready(other.BuildID)
	got, tags, err := b.AssignTags(ctx, "t1", "app:"+app.BuildID, []string{"v1"})
	if err != nil || got != app.BuildID || len(tags) != 1 {
		t.Fatalf("app:<its build>: %q %v %v", got, tags, err)
	}
	if tg, err := st.GetTag(ctx, app.Template.ID, "v1"); err != nil || tg.BuildID != app.BuildID {
		t.Errorf("v1 = %+v %v", tg, err)
	}
	if _, _, err := b.AssignTags(ctx, "t1", "app:"+other.BuildID, []string{"v2"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("app:<other's build>: %v, want not found", err)
	}
	if _, _, err := b.AssignTags(ctx, "t2", "app:"+app.BuildID, []string{"v3"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team: %v, want not found", err)
	}
}
