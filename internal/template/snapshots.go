package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// Snapshots of running sandboxes are templates of their team.
//
// POST /sandboxes/{id}/snapshots checkpoints the sandbox in place (the
// sandbox manager's Snapshot: it runs on) into the image store's
// snapshots/sbx-<buildID>/, with a copy of its disk, and records a
// template with one ready build whose image.Template restores from it:
// sandboxes created from the template's ID, name or name:tag continue the
// snapshotted processes. The template records the sandbox it was taken
// from (store.Template.SnapshotOf), which lists it among the team's
// snapshots. A name the team already gave a snapshot gets a new build
// under the tag asked for; any other template's name is a conflict.
// DELETE /templates/{id} deletes it with its snapshots' files.

// snapshotDirPrefix names a sandbox snapshot's directory in the image
// store's snapshots/: the build ID follows.
const snapshotDirPrefix = "sbx-"

// Snapshotter takes snapshots of running sandboxes: the sandbox manager.
type Snapshotter interface {
	Snapshot(ctx context.Context, teamID team.ID, sandboxID, dir string) (sandbox.Snapshot, error)
}

// UseSandboxes gives the builder the sandbox manager, which is made after
// it (the manager resolves templates through the builder).
func (b *Builder) UseSandboxes(s Snapshotter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sandboxes = s
}

// SnapshotRef names a snapshot as the API shows it: SnapshotID is usable as
// a create's templateID ("name:tag", or "<templateID>:tag" without a name).
type SnapshotRef struct {
	SnapshotID string
	Names      []string
	// Template is the snapshot's template record.
	Template store.Template
}

// CreateSnapshot snapshots a team's running sandbox into a template of the
// team, named name ("", "name" or "name:tag"; a namespace before a '/' is
// dropped).
func (b *Builder) CreateSnapshot(ctx context.Context, teamID, createdBy, sandboxID, name string) (SnapshotRef, error) {
	tm, err := team.Parse(teamID)
	if err != nil {
		return SnapshotRef{}, fmt.Errorf("%w: %v", ErrForbidden, err)
	}
	alias, tag, existing, err := b.snapshotName(ctx, teamID, name)
	if err != nil {
		return SnapshotRef{}, err
	}
	b.mu.Lock()
	snapshotter := b.sandboxes
	b.mu.Unlock()
	if snapshotter == nil {
		return SnapshotRef{}, errors.New("template: no sandbox manager to take snapshots with")
	}
	buildID := newUUID()
	snapID := snapshotDirPrefix + buildID
	snap, err := snapshotter.Snapshot(ctx, tm, sandboxID, b.cfg.Images.SnapshotDir(snapID))
	if err != nil {
		return SnapshotRef{}, err
	}
	// With a blob store, answered once it is durable there
	// (snapshotblobs.go).
	undo, err := b.storeSnapshot(ctx, teamID, buildID, snapID, snap)
	if err != nil {
		_ = b.cfg.Images.RemoveSnapshot(snapID)
		return SnapshotRef{}, err
	}
	ref, err := b.recordSnapshot(ctx, teamID, createdBy, alias, tag, existing, buildID, snapID, snap)
	if err != nil {
		undo()
		_ = b.cfg.Images.RemoveSnapshot(snapID)
		_ = b.cfg.Images.RemoveTemplate(buildID)
		return SnapshotRef{}, err
	}
	return ref, nil
}

// snapshotName checks a snapshot's name: the alias and tag it gives (""
// and "default" without one), and the team's snapshot template that
// already has it, if any.
func (b *Builder) snapshotName(ctx context.Context, teamID, name string) (alias, tag string, existing *store.Template, err error) {
	tag = DefaultTag
	if name == "" {
		return "", tag, nil, nil
	}
	if len(name) > 256 {
		return "", "", nil, fmt.Errorf("%w: the name is longer than 256 characters", ErrInvalid)
	}
	// A namespace ("team/name") is the team's and dropped, but must be
	// one well-formed segment: "../../etc" is not a name.
	if ns, _, found := strings.Cut(name, "/"); found && (!namePattern.MatchString(ns) || strings.Count(name, "/") > 1) {
		return "", "", nil, fmt.Errorf("%w: name %q: only one namespace segment of lowercase letters, digits, '.', '_' or '-' may come before the '/'", ErrInvalid, name)
	}
	alias, t := splitRef(name)
	if !namePattern.MatchString(alias) {
		return "", "", nil, fmt.Errorf("%w: name %q must be lowercase letters, digits, '.', '_' or '-' (at most 128)", ErrInvalid, alias)
	}
	if t != "" || strings.HasSuffix(name, ":") {
		if !tagPattern.MatchString(t) {
			return "", "", nil, fmt.Errorf("%w: tag %q must be letters, digits, '.', '_' or '-' (at most 128)", ErrInvalid, t)
		}
		tag = t
	}
	if builtinName(alias) {
		return "", "", nil, fmt.Errorf("%w: the name %q is a built-in template's", ErrConflict, alias)
	}
	found, err := b.cfg.Store.TemplateByName(ctx, teamID, alias)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return alias, tag, nil, nil
	case err != nil:
		return "", "", nil, err
	case found.SnapshotOf == "":
		return "", "", nil, fmt.Errorf("%w: the name %q is the team's template, not a snapshot: choose another name", ErrConflict, alias)
	}
	return alias, tag, &found, nil
}

// recordSnapshot writes a snapshot's image template, then its template
// (new, or the existing one), its ready build and its tag.
func (b *Builder) recordSnapshot(ctx context.Context, teamID, createdBy, alias, tag string, existing *store.Template, buildID, snapID string, snap sandbox.Snapshot) (SnapshotRef, error) {
	img := snap.Image
	img.ID, img.Snapshot = buildID, snapID
	if err := b.cfg.Images.PutTemplate(&img); err != nil {
		return SnapshotRef{}, err
	}
	src := snap.Sandbox
	now := time.Now()
	var t store.Template
	var err error
	if existing == nil {
		t = store.Template{
			ID: sandbox.NewID(), TeamID: teamID, CPUCount: src.CPUCount, MemoryMB: src.MemoryMB, DiskSizeMB: src.DiskSizeMB,
			CreatedAt: now, UpdatedAt: now, BuildCount: 1, CreatedBy: createdBy, SnapshotOf: src.ID,
		}
		if alias != "" {
			t.Names = []string{alias}
		}
		if err = b.cfg.Store.CreateTemplate(ctx, t); errors.Is(err, store.ErrConflict) {
			return SnapshotRef{}, fmt.Errorf("%w: the name %q was taken meanwhile", ErrConflict, alias)
		}
	} else {
		t, err = b.cfg.Store.UpdateTemplate(ctx, existing.ID, func(x *store.Template) error {
			if x.TeamID != teamID || x.SnapshotOf == "" {
				return fmt.Errorf("%w: the name %q changed hands meanwhile", ErrConflict, alias)
			}
			x.SnapshotOf, x.BuildCount, x.UpdatedAt = src.ID, x.BuildCount+1, now
			x.CPUCount, x.MemoryMB, x.DiskSizeMB = src.CPUCount, src.MemoryMB, src.DiskSizeMB
			return nil
		})
	}
	if err != nil {
		return SnapshotRef{}, err
	}
	bd := store.Build{
		ID: buildID, TemplateID: t.ID, Status: store.BuildReady,
		CPUCount: src.CPUCount, MemoryMB: src.MemoryMB, DiskSizeMB: src.DiskSizeMB, EnvdVersion: src.EnvdVersion,
		Spec: buildRecord{Tags: []string{tag}}.String(), Node: b.cfg.NodeName,
		CreatedAt: now, UpdatedAt: now, FinishedAt: now,
	}
	if err := b.cfg.Store.CreateBuild(ctx, bd); err != nil {
		if existing == nil {
			_ = b.cfg.Store.DeleteTemplate(context.WithoutCancel(ctx), t.ID)
		}
		return SnapshotRef{}, err
	}
	if err := b.cfg.Store.SetTag(ctx, store.Tag{TemplateID: t.ID, Tag: tag, BuildID: buildID, CreatedAt: now, SnapshotOf: src.ID}); err != nil {
		return SnapshotRef{}, err
	}
	b.recordDisk(store.DiskSnapshot, t, buildID)
	return snapshotRef(t, tag), nil
}

func snapshotRef(t store.Template, tag string) SnapshotRef {
	ref := SnapshotRef{SnapshotID: t.ID + ":" + tag, Names: []string{}, Template: t}
	if len(t.Names) > 0 {
		ref.SnapshotID = t.Names[0] + ":" + tag
		ref.Names = t.Names
	}
	return ref
}

// ListSnapshots lists a team's snapshots, newest first, by the sandbox
// they were taken from or by name (either may be ""), a page of limit
// after the cursor (nil: from the start).
func (b *Builder) ListSnapshots(ctx context.Context, teamID, sandboxID, name string, limit int, after *store.Cursor) ([]SnapshotRef, error) {
	f := store.SnapshotFilter{TeamID: teamID, SandboxID: sandboxID, After: after, Limit: limit}
	if name != "" {
		f.Name, _ = splitRef(name)
	}
	ts, err := b.cfg.Store.ListSnapshotTemplates(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]SnapshotRef, 0, len(ts))
	for _, t := range ts {
		out = append(out, snapshotRef(t, b.latestTag(ctx, t.ID)))
	}
	return out, nil
}

// latestTag is the tag of a template's newest build that has one.
func (b *Builder) latestTag(ctx context.Context, templateID string) string {
	tags, err := b.cfg.Store.ListTags(ctx, templateID)
	if err != nil || len(tags) == 0 {
		return DefaultTag
	}
	best := tags[0]
	for _, tg := range tags[1:] {
		if tg.CreatedAt.After(best.CreatedAt) {
			best = tg
		}
	}
	return best.Tag
}

// removeSnapshotFiles deletes the snapshot directories of a deleted
// template's builds that were taken of sandboxes (a build's start-command
// snapshot is shared through the cache and stays).
func (b *Builder) removeSnapshotFiles(builds []store.Build) error {
	var errs []error
	for _, bd := range builds {
		img, err := b.cfg.Images.Template(bd.ID)
		if err != nil || !img.SnapshotDisk || !strings.HasPrefix(img.Snapshot, snapshotDirPrefix) {
			continue
		}
		errs = append(errs, b.cfg.Images.RemoveSnapshot(img.Snapshot))
	}
	return errors.Join(errs...)
}

// removeOrphanSnapshots removes sandbox snapshots whose build the store
// does not know: taken when warren stopped before recording them.
func (b *Builder) removeOrphanSnapshots(ctx context.Context) {
	dirs, _ := filepath.Glob(b.cfg.Images.SnapshotDir(snapshotDirPrefix + "*"))
	for _, d := range dirs {
		buildID := strings.TrimPrefix(filepath.Base(d), snapshotDirPrefix)
		if _, err := b.cfg.Store.GetBuild(ctx, buildID); !errors.Is(err, store.ErrNotFound) {
			continue
		}
		if fi, err := os.Stat(d); err == nil && time.Since(fi.ModTime()) < time.Minute {
			continue // being taken now, by a warren sharing this data dir
		}
		b.log.Warn("removing a snapshot no template records", "dir", d)
		_ = b.cfg.Images.RemoveSnapshot(filepath.Base(d))
		_ = b.cfg.Images.RemoveTemplate(buildID)
	}
}
