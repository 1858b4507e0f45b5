package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/internal/volume"
)

// TestVolumeMountsOnCreate: a create names team volumes; they are
// checked, resolved, recorded and given to the node (nodeRequest) as
// bind mounts; such a create starts cold even with a warm sandbox ready;
// the record keeps them across a restart, and the volume cannot be
// deleted meanwhile.
func TestVolumeMountsOnCreate(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	root := filepath.Join(t.TempDir(), "volumes")
	vols, err := volume.Open(volume.Config{Root: root, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mountinfo.RemoveTree(root) })
	v, err := vols.Create(ctx, "t1", "data")
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, st, Config{PoolSize: 1, Volumes: vols})
	e.waitWarm(1)
	ids := func() []string {
		l, _ := st.ListSandboxes(ctx, store.SandboxFilter{Teams: store.ForTeam("t1")})
		var out []string
		for _, s := range l {
			out = append(out, s.ID)
		}
		return out
	}
	before := ids()
	if _, err := e.create(CreateRequest{VolumeMounts: []VolumeMount{{Name: "nope", Path: "/data"}}}); !errors.Is(err, ErrVolumeNotFound) {
		t.Errorf("an unknown volume: %v", err)
	}
	for _, p := range []string{"data", "/proc/x", "/", "/opt/warren/envd"} {
		if _, err := e.create(CreateRequest{VolumeMounts: []VolumeMount{{Name: "data", Path: p}}}); !errors.Is(err, ErrInvalid) {
			t.Errorf("mount path %q: %v", p, err)
		}
	}
	if after := ids(); !reflect.DeepEqual(after, before) {
		t.Errorf("refused creates left records: %v", after)
	}

	rec, err := e.create(CreateRequest{VolumeMounts: []VolumeMount{{Name: "data", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.VolumeMount{{VolumeID: v.ID, Name: "data", Path: "/data"}}
	if !reflect.DeepEqual(rec.VolumeMounts, want) {
		t.Errorf("recorded mounts %+v, want %+v", rec.VolumeMounts, want)
	}
	if _, warm := e.mgr.Count(); warm != 1 {
		t.Errorf("a create with volumes took the warm sandbox (%d warm left)", warm)
	}
	dir, _ := vols.HostDir(ctx, v.ID)
	req, err := e.mgr.nodeRequest(ctx, rec)
	if err != nil || !reflect.DeepEqual(req.Mounts, []runtime.Mount{{Source: dir, Destination: "/data"}}) {
		t.Errorf("nodeRequest mounts %+v %v", req.Mounts, err)
	}
	if err := vols.Delete(ctx, "t1", v.ID); !errors.Is(err, volume.ErrInUse) {
		t.Errorf("deleting a mounted volume: %v", err)
	}

	e.stop()
	e = start(t, st, Config{Volumes: vols})
	defer e.destroy()
	got, err := e.mgr.Get(ctx, team.MustParse("t1"), rec.ID)
	if err != nil || !reflect.DeepEqual(got.VolumeMounts, want) {
		t.Errorf("after a restart: %+v %v", got.VolumeMounts, err)
	}
	if err := e.mgr.Kill(ctx, team.MustParse("t1"), rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := vols.Delete(ctx, "t1", v.ID); err != nil {
		t.Errorf("deleting the volume once its sandbox is gone: %v", err)
	}
}
