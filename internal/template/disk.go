package template

import (
	"context"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/hostres"
	"github.com/warren-sandbox/warren/internal/store"
)

// recordDisk records what template t's image of build buildID takes of
// this node's disk, for its team's disk quota (store.DiskUsageStore): a
// built template's layers that the base image does not have and its
// checkpoint; a snapshot's checkpoint and disk copy (its layers are its
// source template's). A template counts its latest build or snapshot.
// Approximate: a layer shared by several of a team's templates (a step
// cache hit, a template built FROM another) counts in each, and older
// builds' images kept on the node count in none.
func (b *Builder) recordDisk(kind string, t store.Template, buildID string) {
	err := func() error {
		img, err := b.cfg.Images.Template(buildID)
		if err != nil {
			return err
		}
		var dirs []string
		if kind == store.DiskTemplate {
			base := map[string]bool{}
			if bi, err := b.cfg.Images.Template(baseimage.TemplateID); err == nil {
				for _, l := range bi.Layers {
					base[l] = true
				}
			}
			for _, l := range img.Layers {
				if !base[l] {
					dirs = append(dirs, b.cfg.Images.LayerDir(l))
				}
			}
		}
		if img.Snapshot != "" {
			dirs = append(dirs, b.cfg.Images.SnapshotDir(img.Snapshot))
		}
		n, err := hostres.AllocatedBytes(dirs...)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return b.cfg.Store.SetDiskUse(ctx, store.DiskUse{Kind: kind, ObjectID: t.ID, TeamID: t.TeamID,
			Node: b.cfg.NodeName, Bytes: n, UpdatedAt: time.Now()})
	}()
	if err != nil {
		b.log.Warn("recording a template's disk use", "template", t.ID, "build", buildID, "err", err)
	}
}
