package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

func newTemplate(id string, created time.Time, names ...string) Template {
	return Template{
		ID: id, TeamID: "team1", Names: names, Public: true, CPUCount: 2, MemoryMB: 1024, DiskSizeMB: 4096,
		CreatedAt: created, UpdatedAt: created, LastSpawnedAt: created.Add(time.Minute), SpawnCount: 1 << 40,
		BuildCount: 3, CreatedBy: "k1",
	}
}

func templateIDs(ts []Template) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

func TestTemplatesCRUD(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		tp := newTemplate("tpl1", t0, "zeta", "alpha", "mid")
		if err := s.CreateTemplate(ctx, tp); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetTemplate(ctx, "tpl1")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tp) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, tp)
		}
		if byName, err := s.TemplateByName(ctx, "team1", "alpha"); err != nil || !reflect.DeepEqual(byName, tp) {
			t.Errorf("TemplateByName(alpha) = %+v %v", byName, err)
		}
		if _, err := s.TemplateByName(ctx, "team1", "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown name: %v", err)
		}
		if _, err := s.GetTemplate(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown template: %v", err)
		}

		// Conflicts: the same ID, or a name of another template.
		if err := s.CreateTemplate(ctx, newTemplate("tpl1", t0, "other")); !errors.Is(err, ErrConflict) {
			t.Errorf("duplicate ID: %v", err)
		}
		if err := s.CreateTemplate(ctx, newTemplate("tpl2", t0, "fresh", "mid")); !errors.Is(err, ErrConflict) {
			t.Errorf("taken name: %v", err)
		}
		if _, err := s.GetTemplate(ctx, "tpl2"); !errors.Is(err, ErrNotFound) {
			t.Errorf("a create that failed on a name left the template: %v", err)
		}
		if _, err := s.TemplateByName(ctx, "team1", "fresh"); !errors.Is(err, ErrNotFound) {
			t.Errorf("a create that failed on a name left another name: %v", err)
		}
		if _, err := s.TemplateByName(ctx, "team1", "other"); !errors.Is(err, ErrNotFound) {
			t.Errorf("a create that failed on the ID left a name: %v", err)
		}

		// Listing: a team's templates by creation, then ID.
		if err := s.CreateTemplate(ctx, newTemplate("tpl0", t0.Add(time.Second), "b")); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateTemplate(ctx, newTemplate("tpl3", t0, "c")); err != nil {
			t.Fatal(err)
		}
		otherTeam := newTemplate("tplx", t0, "x")
		otherTeam.TeamID = "team2"
		if err := s.CreateTemplate(ctx, otherTeam); err != nil {
			t.Fatal(err)
		}
		if noNames := newTemplate("bare", t0.Add(time.Hour)); s.CreateTemplate(ctx, noNames) != nil {
			t.Fatal("template without names")
		}
		list, err := s.ListTemplates(ctx, "team1")
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(templateIDs(list)) != "[tpl1 tpl3 tpl0 bare]" {
			t.Errorf("ListTemplates = %v", templateIDs(list))
		}
		if fmt.Sprint(list[0].Names) != "[zeta alpha mid]" || list[3].Names != nil {
			t.Errorf("listed names %v, %v", list[0].Names, list[3].Names)
		}
		if list, _ := s.ListTemplates(ctx, "team2"); fmt.Sprint(templateIDs(list)) != "[tplx]" {
			t.Errorf("team2 lists %v", templateIDs(list))
		}
		if list, err := s.ListTemplates(ctx, "team3"); err != nil || len(list) != 0 {
			t.Errorf("empty team lists %v %v", list, err)
		}
	})
}

func TestUpdateTemplate(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		if err := s.CreateTemplate(ctx, newTemplate("tpl1", t0, "one", "uno")); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateTemplate(ctx, newTemplate("tpl2", t0, "two")); err != nil {
			t.Fatal(err)
		}
		before := time.Now().Add(-time.Second)
		upd, err := s.UpdateTemplate(ctx, "tpl1", func(tp *Template) error {
			tp.Names = []string{"eins", "one"} // drops "uno"
			tp.SpawnCount++
			tp.LastSpawnedAt = t0.Add(time.Hour)
			tp.Public = false
			tp.ID = "ignored"
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if upd.ID != "tpl1" || upd.UpdatedAt.Before(before) {
			t.Errorf("UpdateTemplate returned %+v", upd)
		}
		got, err := s.GetTemplate(ctx, "tpl1")
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got.Names) != "[eins one]" || got.SpawnCount != 1<<40+1 || got.Public ||
			!got.LastSpawnedAt.Equal(t0.Add(time.Hour)) || got.UpdatedAt.Before(before) || !got.CreatedAt.Equal(t0) {
			t.Errorf("after update %+v", got)
		}
		if byName, err := s.TemplateByName(ctx, "team1", "eins"); err != nil || byName.ID != "tpl1" {
			t.Errorf("new name: %+v %v", byName, err)
		}
		if _, err := s.TemplateByName(ctx, "team1", "uno"); !errors.Is(err, ErrNotFound) {
			t.Errorf("dropped name still found: %v", err)
		}

		// A name of another template conflicts and nothing is written.
		_, err = s.UpdateTemplate(ctx, "tpl1", func(tp *Template) error {
			tp.Names = append(tp.Names, "two")
			tp.CPUCount = 8
			return nil
		})
		if !errors.Is(err, ErrConflict) {
			t.Errorf("taking another template's name: %v", err)
		}
		if got, _ := s.GetTemplate(ctx, "tpl1"); got.CPUCount != 2 || fmt.Sprint(got.Names) != "[eins one]" {
			t.Errorf("a conflicting update was written: %+v", got)
		}
		if byName, _ := s.TemplateByName(ctx, "team1", "two"); byName.ID != "tpl2" {
			t.Errorf("name two now belongs to %q", byName.ID)
		}
		if byName, _ := s.TemplateByName(ctx, "team1", "one"); byName.ID != "tpl1" {
			t.Errorf("name one now belongs to %q", byName.ID)
		}

		// Renaming frees the old name for another template.
		if _, err := s.UpdateTemplate(ctx, "tpl2", func(tp *Template) error { tp.Names = []string{"deux"}; return nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateTemplate(ctx, "tpl1", func(tp *Template) error { tp.Names = []string{"two", "one"}; return nil }); err != nil {
			t.Errorf("taking a freed name: %v", err)
		}
		if byName, err := s.TemplateByName(ctx, "team1", "two"); err != nil || byName.ID != "tpl1" {
			t.Errorf("freed name: %+v %v", byName, err)
		}
		if got, _ := s.GetTemplate(ctx, "tpl1"); fmt.Sprint(got.Names) != "[two one]" {
			t.Errorf("names kept in order: %v", got.Names)
		}

		boom := errors.New("boom")
		if _, err := s.UpdateTemplate(ctx, "tpl1", func(tp *Template) error { tp.Names = nil; return boom }); !errors.Is(err, boom) {
			t.Errorf("aborted update: %v", err)
		}
		if got, _ := s.GetTemplate(ctx, "tpl1"); len(got.Names) != 2 {
			t.Errorf("an aborted update was written: %v", got.Names)
		}
		if _, err := s.UpdateTemplate(ctx, "nope", func(*Template) error { return nil }); !errors.Is(err, ErrNotFound) {
			t.Errorf("update of missing: %v", err)
		}
	})
}

func TestConcurrentTemplateUpdatesSerialise(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		tp := newTemplate("tpl", t0, "n")
		tp.SpawnCount = 0
		if err := s.CreateTemplate(ctx, tp); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := s.UpdateTemplate(ctx, "tpl", func(x *Template) error { x.SpawnCount++; return nil }); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if got, _ := s.GetTemplate(ctx, "tpl"); got.SpawnCount != 20 {
			t.Errorf("SpawnCount = %d after 20 increments: lost updates", got.SpawnCount)
		}
	})
}

func newBuild(id, templateID string, created time.Time) Build {
	return Build{
		ID: id, TemplateID: templateID, Status: BuildWaiting, CPUCount: 2, MemoryMB: 1024, DiskSizeMB: 4096,
		EnvdVersion: "0.6.4", CreatedAt: created, UpdatedAt: created,
	}
}

func buildIDs(bs []Build) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return out
}

func TestBuildLifecycle(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTemplate(ctx, newTemplate("tpl1", t0, "one"))
		s.CreateTemplate(ctx, newTemplate("tpl2", t0, "two"))
		b := newBuild("b2", "tpl1", t0.Add(2*time.Second))
		if err := s.CreateBuild(ctx, b); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateBuild(ctx, b); !errors.Is(err, ErrConflict) {
			t.Errorf("duplicate build: %v", err)
		}
		if got, err := s.GetBuild(ctx, "b2"); err != nil || !reflect.DeepEqual(got, b) {
			t.Errorf("round trip:\n got %+v %v\nwant %+v", got, err, b)
		}
		if _, err := s.GetBuild(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("missing build: %v", err)
		}
		for _, nb := range []Build{newBuild("b1", "tpl1", t0.Add(time.Second)), newBuild("b3", "tpl1", t0.Add(3*time.Second)), newBuild("c1", "tpl2", t0)} {
			if err := s.CreateBuild(ctx, nb); err != nil {
				t.Fatal(err)
			}
		}
		if list, err := s.ListBuilds(ctx, "tpl1"); err != nil || fmt.Sprint(buildIDs(list)) != "[b1 b2 b3]" {
			t.Errorf("ListBuilds(tpl1) = %v %v", buildIDs(list), err)
		}
		if list, _ := s.ListBuilds(ctx, "tpl2"); fmt.Sprint(buildIDs(list)) != "[c1]" {
			t.Errorf("ListBuilds(tpl2) = %v", buildIDs(list))
		}

		// waiting → building → ready | error
		spec := `{"fromImage":"ubuntu:24.04","steps":[]}`
		if _, err := s.UpdateBuild(ctx, "b2", func(b *Build) error {
			b.Status, b.Spec, b.Node = BuildBuilding, spec, "node1"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		done := t0.Add(time.Minute)
		upd, err := s.UpdateBuild(ctx, "b3", func(b *Build) error {
			b.Status, b.ReasonMessage, b.ReasonStep, b.FinishedAt = BuildError, "exit status 1", "2", done
			b.ID = "ignored"
			return nil
		})
		if err != nil || upd.ID != "b3" || upd.Status != BuildError {
			t.Errorf("UpdateBuild = %+v %v", upd, err)
		}
		got, _ := s.GetBuild(ctx, "b2")
		if got.Status != BuildBuilding || got.Spec != spec || got.Node != "node1" || !got.CreatedAt.Equal(t0.Add(2*time.Second)) ||
			!got.FinishedAt.IsZero() || !got.UpdatedAt.After(t0) {
			t.Errorf("b2 after update %+v", got)
		}
		got, _ = s.GetBuild(ctx, "b3")
		if got.Status != BuildError || got.ReasonMessage != "exit status 1" || got.ReasonStep != "2" || !got.FinishedAt.Equal(done) {
			t.Errorf("b3 after update %+v", got)
		}
		boom := errors.New("boom")
		if _, err := s.UpdateBuild(ctx, "b2", func(b *Build) error { b.Status = BuildReady; return boom }); !errors.Is(err, boom) {
			t.Errorf("aborted update: %v", err)
		}
		if got, _ := s.GetBuild(ctx, "b2"); got.Status != BuildBuilding {
			t.Error("an aborted build update was written")
		}
		if _, err := s.UpdateBuild(ctx, "nope", func(*Build) error { return nil }); !errors.Is(err, ErrNotFound) {
			t.Errorf("update of missing build: %v", err)
		}

		byStatus := func(st ...BuildStatus) string {
			t.Helper()
			list, err := s.BuildsByStatus(ctx, st...)
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprint(buildIDs(list))
		}
		if got := byStatus(BuildWaiting); got != "[c1 b1]" {
			t.Errorf("waiting: %s", got)
		}
		if got := byStatus(BuildWaiting, BuildBuilding); got != "[c1 b1 b2]" {
			t.Errorf("waiting or building: %s", got)
		}
		if got := byStatus(BuildError); got != "[b3]" {
			t.Errorf("error: %s", got)
		}
		if got := byStatus(BuildReady); got != "[]" {
			t.Errorf("ready: %s", got)
		}
		if got := byStatus(); got != "[]" {
			t.Errorf("no statuses: %s", got)
		}
	})
}

func TestBuildLogs(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTemplate(ctx, newTemplate("tpl", t0, "n"))
		s.CreateBuild(ctx, newBuild("b", "tpl", t0))
		s.CreateBuild(ctx, newBuild("other", "tpl", t0))
		levels := []string{"info", "debug", "warn", "error", "info"}
		var entries []BuildLogEntry
		for i, l := range levels {
			entries = append(entries, BuildLogEntry{Time: t0.Add(time.Duration(i) * time.Second), Level: l, Step: fmt.Sprint(i), Message: fmt.Sprintf("m%d", i)})
		}
		if err := s.AppendBuildLogs(ctx, "b", entries[:3]...); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendBuildLogs(ctx, "b", entries[3:]...); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendBuildLogs(ctx, "b"); err != nil {
			t.Errorf("appending nothing: %v", err)
		}
		if err := s.AppendBuildLogs(ctx, "other", BuildLogEntry{Time: t0, Level: "error", Message: "elsewhere"}); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendBuildLogs(ctx, "nope", entries...); !errors.Is(err, ErrNotFound) {
			t.Errorf("logs of a missing build: %v", err)
		}

		msgs := func(offset, limit int, minLevel string) string {
			t.Helper()
			got, err := s.BuildLogs(ctx, "b", offset, limit, minLevel)
			if err != nil {
				t.Fatal(err)
			}
			if got == nil {
				t.Error("nil slice")
			}
			var out []string
			for _, e := range got {
				out = append(out, e.Message)
			}
			return fmt.Sprint(out)
		}
		all, err := s.BuildLogs(ctx, "b", 0, 100, "")
		if err != nil || !reflect.DeepEqual(all, entries) {
			t.Errorf("all logs:\n got %+v %v\nwant %+v", all, err, entries)
		}
		for _, c := range []struct {
			offset, limit int
			minLevel      string
			want          string
		}{
			{0, 100, "", "[m0 m1 m2 m3 m4]"},
			{2, 2, "", "[m2 m3]"},
			{4, 10, "", "[m4]"},
			{5, 10, "", "[]"},
			{-3, 2, "", "[m0 m1]"},
			{0, 0, "", "[]"},
			{0, -1, "", "[]"},
			{0, 100, "debug", "[m0 m1 m2 m3 m4]"},
			{0, 100, "info", "[m0 m2 m3 m4]"},
			{0, 100, "warn", "[m2 m3]"},
			{1, 100, "warn", "[m3]"},
			{0, 100, "error", "[m3]"},
			{1, 2, "info", "[m2 m3]"},
			{0, 100, "bogus", "[m0 m2 m3 m4]"}, // an unknown level counts as info
		} {
			if got := msgs(c.offset, c.limit, c.minLevel); got != c.want {
				t.Errorf("BuildLogs(offset %d, limit %d, %q) = %s, want %s", c.offset, c.limit, c.minLevel, got, c.want)
			}
		}
		// An entry of an unknown level is ranked as info.
		s.AppendBuildLogs(ctx, "b", BuildLogEntry{Time: t0, Level: "notice", Message: "m5"})
		if got := msgs(0, 100, "info"); got != "[m0 m2 m3 m4 m5]" {
			t.Errorf("unknown level entry with minLevel info: %s", got)
		}
		if got := msgs(0, 100, "warn"); got != "[m2 m3]" {
			t.Errorf("unknown level entry with minLevel warn: %s", got)
		}
		if got, err := s.BuildLogs(ctx, "nope", 0, 10, ""); err != nil || len(got) != 0 {
			t.Errorf("logs of an unknown build: %v %v", got, err)
		}
	})
}

func TestConcurrentAppendBuildLogs(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTemplate(ctx, newTemplate("tpl", t0, "n"))
		s.CreateBuild(ctx, newBuild("b", "tpl", t0))
		const writers, each = 8, 20
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; {
					// Mostly one entry per call, sometimes two.
					n := 1
					if i%4 == 0 {
						n = 2
					}
					var es []BuildLogEntry
					for ; n > 0; n-- {
						es = append(es, BuildLogEntry{Time: t0, Level: "info", Step: fmt.Sprint(w), Message: fmt.Sprintf("%d/%d", w, i)})
						i++
					}
					if err := s.AppendBuildLogs(ctx, "b", es...); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		got, err := s.BuildLogs(ctx, "b", 0, 1000, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != writers*each {
			t.Fatalf("%d entries after appending %d", len(got), writers*each)
		}
		// Every entry once, and each writer's entries in its order.
		seen := map[string]bool{}
		next := map[string]int{}
		for _, e := range got {
			if seen[e.Message] {
				t.Errorf("entry %s twice", e.Message)
			}
			seen[e.Message] = true
			var w, i int
			fmt.Sscanf(e.Message, "%d/%d", &w, &i)
			if i != next[e.Step] {
				t.Errorf("writer %s: entry %d where %d was due", e.Step, i, next[e.Step])
			}
			next[e.Step] = i + 1
		}
		// Offsets index the sequence without gaps.
		for _, off := range []int{0, 1, 79, 159} {
			page, err := s.BuildLogs(ctx, "b", off, 1, "")
			if err != nil || len(page) != 1 || page[0].Message != got[off].Message {
				t.Errorf("entry at %d: %v %v, want %s", off, page, err, got[off].Message)
			}
		}
		if page, _ := s.BuildLogs(ctx, "b", 160, 10, ""); len(page) != 0 {
			t.Errorf("past the end: %v", page)
		}
	})
}

func TestTags(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTemplate(ctx, newTemplate("tpl", t0, "n"))
		s.CreateTemplate(ctx, newTemplate("tpl2", t0, "m"))
		s.CreateBuild(ctx, newBuild("b1", "tpl", t0))
		s.CreateBuild(ctx, newBuild("b2", "tpl", t0.Add(time.Second)))
		s.CreateBuild(ctx, newBuild("c1", "tpl2", t0))

		latest := Tag{TemplateID: "tpl", Tag: "latest", BuildID: "b1", CreatedAt: t0}
		if err := s.SetTag(ctx, latest); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetTag(ctx, "tpl", "latest"); err != nil || got != latest {
			t.Errorf("GetTag = %+v %v", got, err)
		}
		if err := s.SetTag(ctx, Tag{TemplateID: "tpl", Tag: "v1", BuildID: "b1", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTag(ctx, Tag{TemplateID: "tpl2", Tag: "latest", BuildID: "c1", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		// Move latest.
		moved := Tag{TemplateID: "tpl", Tag: "latest", BuildID: "b2", CreatedAt: t0.Add(time.Minute)}
		if err := s.SetTag(ctx, moved); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetTag(ctx, "tpl", "latest"); err != nil || got != moved {
			t.Errorf("moved tag = %+v %v", got, err)
		}
		if got, _ := s.GetTag(ctx, "tpl2", "latest"); got.BuildID != "c1" {
			t.Errorf("another template's tag moved: %+v", got)
		}
		// Only one of the template's own builds.
		if err := s.SetTag(ctx, Tag{TemplateID: "tpl", Tag: "x", BuildID: "c1"}); !errors.Is(err, ErrNotFound) {
			t.Errorf("tag to another template's build: %v", err)
		}
		if err := s.SetTag(ctx, Tag{TemplateID: "tpl", Tag: "x", BuildID: "nope"}); !errors.Is(err, ErrNotFound) {
			t.Errorf("tag to a missing build: %v", err)
		}
		if err := s.SetTag(ctx, Tag{TemplateID: "tpl", Tag: "zzz", BuildID: "b2"}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetTag(ctx, "tpl", "zzz"); got.CreatedAt.IsZero() {
			t.Error("a tag set without CreatedAt has none")
		}

		tags, err := s.ListTags(ctx, "tpl")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tg := range tags {
			names = append(names, tg.Tag+"="+tg.BuildID)
		}
		if fmt.Sprint(names) != "[latest=b2 v1=b1 zzz=b2]" {
			t.Errorf("ListTags = %v", names)
		}

		if err := s.DeleteTag(ctx, "tpl", "v1"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTag(ctx, "tpl", "v1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("second delete: %v", err)
		}
		if err := s.DeleteTag(ctx, "tpl", "x"); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete of a tag never set: %v", err)
		}
		if _, err := s.GetTag(ctx, "tpl", "v1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("deleted tag: %v", err)
		}
		if _, err := s.GetTag(ctx, "tpl2", "v1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("missing tag: %v", err)
		}
		if tags, _ := s.ListTags(ctx, "tpl"); len(tags) != 2 {
			t.Errorf("after delete %v", tags)
		}
		if tags, err := s.ListTags(ctx, "nope"); err != nil || len(tags) != 0 {
			t.Errorf("tags of a missing template: %v %v", tags, err)
		}
	})
}

func TestDeleteTemplateCascades(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTemplate(ctx, newTemplate("tpl", t0, "gone", "also-gone"))
		s.CreateTemplate(ctx, newTemplate("keep", t0, "kept"))
		for _, b := range []Build{newBuild("b1", "tpl", t0), newBuild("b2", "tpl", t0), newBuild("k1", "keep", t0)} {
			if err := s.CreateBuild(ctx, b); err != nil {
				t.Fatal(err)
			}
			if err := s.AppendBuildLogs(ctx, b.ID, BuildLogEntry{Time: t0, Level: "info", Message: b.ID}); err != nil {
				t.Fatal(err)
			}
			if err := s.SetTag(ctx, Tag{TemplateID: b.TemplateID, Tag: "t-" + b.ID, BuildID: b.ID, CreatedAt: t0}); err != nil {
				t.Fatal(err)
			}
		}

		if err := s.DeleteTemplate(ctx, "tpl"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTemplate(ctx, "tpl"); !errors.Is(err, ErrNotFound) {
			t.Errorf("second delete: %v", err)
		}
		if _, err := s.GetTemplate(ctx, "tpl"); !errors.Is(err, ErrNotFound) {
			t.Errorf("deleted template: %v", err)
		}
		for _, n := range []string{"gone", "also-gone"} {
			if _, err := s.TemplateByName(ctx, "team1", n); !errors.Is(err, ErrNotFound) {
				t.Errorf("name %s of a deleted template: %v", n, err)
			}
		}
		for _, id := range []string{"b1", "b2"} {
			if _, err := s.GetBuild(ctx, id); !errors.Is(err, ErrNotFound) {
				t.Errorf("build %s of a deleted template: %v", id, err)
			}
			if logs, _ := s.BuildLogs(ctx, id, 0, 10, ""); len(logs) != 0 {
				t.Errorf("logs of %s remain: %v", id, logs)
			}
		}
		if list, _ := s.ListBuilds(ctx, "tpl"); len(list) != 0 {
			t.Errorf("builds remain: %v", buildIDs(list))
		}
		if tags, _ := s.ListTags(ctx, "tpl"); len(tags) != 0 {
			t.Errorf("tags remain: %v", tags)
		}
		if list, _ := s.BuildsByStatus(ctx, BuildWaiting); fmt.Sprint(buildIDs(list)) != "[k1]" {
			t.Errorf("waiting builds after delete: %v", buildIDs(list))
		}

		// The other template is untouched.
		if got, err := s.TemplateByName(ctx, "team1", "kept"); err != nil || got.ID != "keep" {
			t.Errorf("kept template: %+v %v", got, err)
		}
		if logs, _ := s.BuildLogs(ctx, "k1", 0, 10, ""); len(logs) != 1 || logs[0].Message != "k1" {
			t.Errorf("kept logs: %v", logs)
		}
		if tg, err := s.GetTag(ctx, "keep", "t-k1"); err != nil || tg.BuildID != "k1" {
			t.Errorf("kept tag: %+v %v", tg, err)
		}

		// The names and the ID are free again.
		if err := s.CreateTemplate(ctx, newTemplate("tpl", t0, "gone")); err != nil {
			t.Errorf("reusing a deleted template's ID and name: %v", err)
		}
		if _, err := s.UpdateTemplate(ctx, "keep", func(tp *Template) error {
			tp.Names = append(tp.Names, "also-gone")
			return nil
		}); err != nil {
			t.Errorf("taking a deleted template's name: %v", err)
		}
		if got, _ := s.TemplateByName(ctx, "team1", "also-gone"); got.ID != "keep" {
			t.Errorf("also-gone belongs to %q", got.ID)
		}
		if err := s.DeleteTemplate(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete of a missing template: %v", err)
		}
	})
}

// Snapshot templates are listed per team, newest first, by the sandbox
// they were taken from or by name, a page at a time; an empty team is
// refused, never "every team".
func TestListSnapshotTemplates(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		add := func(id, team, of string, at time.Time, names ...string) {
			t.Helper()
			tp := newTemplate(id, at, names...)
			tp.TeamID, tp.SnapshotOf = team, of
			if err := s.CreateTemplate(ctx, tp); err != nil {
				t.Fatal(err)
			}
		}
		add("built", "team1", "", t0.Add(5*time.Second), "built")
		add("s1", "team1", "sbA", t0, "first")
		add("s2", "team1", "sbB", t0.Add(time.Second))
		add("s3", "team1", "sbA", t0.Add(2*time.Second), "third")
		add("s4", "team1", "sbA", t0.Add(2*time.Second))
		add("other", "team2", "sbA", t0.Add(3*time.Second), "theirs")
		list := func(f SnapshotFilter) string {
			t.Helper()
			got, err := s.ListSnapshotTemplates(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprint(templateIDs(got))
		}
		if got := list(SnapshotFilter{TeamID: "team1"}); got != "[s4 s3 s2 s1]" {
			t.Errorf("team1's snapshots = %s", got)
		}
		if got := list(SnapshotFilter{TeamID: "team1", SandboxID: "sbA"}); got != "[s4 s3 s1]" {
			t.Errorf("snapshots of sbA = %s", got)
		}
		if got := list(SnapshotFilter{TeamID: "team1", Name: "third"}); got != "[s3]" {
			t.Errorf("named third = %s", got)
		}
		if got := list(SnapshotFilter{TeamID: "team1", Name: "theirs"}); got != "[]" {
			t.Errorf("another team's name = %s", got)
		}
		if got := list(SnapshotFilter{TeamID: "team1", Limit: 2}); got != "[s4 s3]" {
			t.Errorf("first page = %s", got)
		}
		after := &Cursor{StartedAt: t0.Add(2 * time.Second), ID: "s3"}
		if got := list(SnapshotFilter{TeamID: "team1", After: after, Limit: 2}); got != "[s2 s1]" {
			t.Errorf("second page = %s", got)
		}
		if _, err := s.ListSnapshotTemplates(ctx, SnapshotFilter{}); err == nil {
			t.Error("a listing without a team was answered")
		}
		if got, _ := s.GetTemplate(ctx, "s3"); got.SnapshotOf != "sbA" {
			t.Errorf("SnapshotOf round trip: %q", got.SnapshotOf)
		}
	})
}

// TestBuildLogIsBoundedInTheStore: whatever its callers do, a build keeps
// at most MaxBuildLogEntries (50000) entries, and the rest is refused.
func TestBuildLogIsBoundedInTheStore(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTemplate(ctx, newTemplate("tpl", t0, "n"))
		s.CreateBuild(ctx, newBuild("b", "tpl", t0))
		batch := make([]BuildLogEntry, 7000)
		for i := range batch {
			batch[i] = BuildLogEntry{Time: t0, Level: "info", Message: "y"}
		}
		var refused error
		for i := 0; i < 8; i++ { // 56000 entries
			if err := s.AppendBuildLogs(ctx, "b", batch...); err != nil {
				refused = err
			}
		}
		if !errors.Is(refused, ErrLogFull) {
			t.Errorf("appending past the cap: %v, want ErrLogFull", refused)
		}
		got, err := s.BuildLogs(ctx, "b", 0, 100000, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 50000 {
			t.Errorf("the build kept %d entries, want 50000", len(got))
		}
	})
}

// TestTemplateNamesArePerTeam: two teams each have a template of the same
// name, found by team; an empty team finds nothing.
func TestTemplateNamesArePerTeam(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mine := newTemplate("mine", t0, "app")
		theirs := newTemplate("theirs", t0, "app", "other")
		theirs.TeamID = "team2"
		if err := s.CreateTemplate(ctx, mine); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateTemplate(ctx, theirs); err != nil {
			t.Fatalf("the same name in another team: %v", err)
		}
		for team, want := range map[string]string{"team1": "mine", "team2": "theirs"} {
			if got, err := s.TemplateByName(ctx, team, "app"); err != nil || got.ID != want {
				t.Errorf("%s's app = %q %v, want %s", team, got.ID, err, want)
			}
		}
		if _, err := s.TemplateByName(ctx, "", "app"); !errors.Is(err, ErrNotFound) {
			t.Errorf("no team finds %v", err)
		}
		if _, err := s.TemplateByName(ctx, "team1", "other"); !errors.Is(err, ErrNotFound) {
			t.Errorf("team1 finds team2's other: %v", err)
		}
		// Renaming into the other team's name is fine; into one's own
		// team's taken name is a conflict.
		if _, err := s.UpdateTemplate(ctx, "mine", func(x *Template) error { x.Names = []string{"app", "other"}; return nil }); err != nil {
			t.Errorf("taking a name another team has: %v", err)
		}
		dup := newTemplate("dup", t0, "app")
		if err := s.CreateTemplate(ctx, dup); !errors.Is(err, ErrConflict) {
			t.Errorf("a taken name in the same team: %v", err)
		}
		if err := s.DeleteTemplate(ctx, "theirs"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.TemplateByName(ctx, "team1", "app"); err != nil || got.ID != "mine" {
			t.Errorf("after the other team's delete: %q %v", got.ID, err)
		}
	})
}
