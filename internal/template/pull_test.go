package template

import (
	"context"
	"errors"
	"testing"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/store"
)

// In a cluster, a template built on another node is pulled from it the
// first time this node starts one; a pull that fails leaves the template
// not found here (the api asks another node).
func TestResolvePullsAnotherNodesBuild(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	var pulled, removed []string
	var pullErr error
	dir := t.TempDir()
	b := newUploadBuilder(t, st, dir, func(c *Config) {
		c.NodeName = "n2"
		c.ImageRemoved = func(id string) { removed = append(removed, id) }
		c.Pull = func(ctx context.Context, node, id string) error {
			pulled = append(pulled, node+" "+id)
			if pullErr != nil {
				return pullErr
			}
			return c.Images.PutTemplate(&image.Template{ID: id, Layers: []string{"l1"}, User: "user", PulledFrom: node})
		}
	})
	c := newTemplate(t, b, "team1", "built-elsewhere")
	if _, err := st.UpdateBuild(ctx, c.BuildID, func(bd *store.Build) error {
		bd.Status, bd.Node = store.BuildReady, "n1"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pullErr = errors.New("node n1 does not answer")
	if _, err := b.Resolve(ctx, "team1", "built-elsewhere"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("with the builder node away: %v", err)
	}
	pullErr = nil
	r, err := b.Resolve(ctx, "team1", "built-elsewhere")
	if err != nil || r.Image.User != "user" || r.BuildID != c.BuildID {
		t.Fatalf("resolved %+v %v", r, err)
	}
	if _, err := b.Resolve(ctx, "team1", "built-elsewhere"); err != nil {
		t.Fatal(err)
	}
	if len(pulled) != 2 || pulled[1] != "n1 "+c.BuildID {
		t.Errorf("pulls: %v (once after the failure, then kept)", pulled)
	}

	// Deleted through its home: the sweep removes the pulled image, and
	// only pulled ones (an imported image has no build either).
	if err := b.cfg.Images.PutTemplate(&image.Template{ID: "imported-x", Layers: []string{"l1"}}); err != nil {
		t.Fatal(err)
	}
	b.forgetDeletedPulls(ctx)
	if len(removed) != 0 {
		t.Fatalf("removed %v while the template exists", removed)
	}
	if err := st.DeleteTemplate(ctx, c.Template.ID); err != nil {
		t.Fatal(err)
	}
	b.forgetDeletedPulls(ctx)
	if _, err := b.cfg.Images.Template(c.BuildID); err == nil || len(removed) != 1 || removed[0] != c.BuildID {
		t.Errorf("after the template's deletion: %v, removed %v", err, removed)
	}
	if _, err := b.cfg.Images.Template("imported-x"); err != nil {
		t.Errorf("an imported image was removed: %v", err)
	}
}
