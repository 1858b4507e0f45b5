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
	var pulled []string
	var pullErr error
	dir := t.TempDir()
	b := newUploadBuilder(t, st, dir, func(c *Config) {
		c.NodeName = "n2"
		c.Pull = func(ctx context.Context, node, id string) error {
			pulled = append(pulled, node+" "+id)
			if pullErr != nil {
				return pullErr
			}
			return c.Images.PutTemplate(&image.Template{ID: id, Layers: []string{"l1"}, User: "user"})
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
}
