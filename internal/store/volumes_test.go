package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
)

func volume(id, team, name string) Volume {
	return Volume{ID: id, TeamID: team, Name: name, Token: "tok-" + id, QuotaMB: 64, CreatedAt: t0}
}

func TestVolumesCRUD(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "a", CreatedAt: t0})
		s.CreateTeam(ctx, Team{ID: "team2", Name: "b", CreatedAt: t0})
		v := volume("v1", "team1", "data")
		if err := s.CreateVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateVolume(ctx, volume("v2", "team1", "data")); !errors.Is(err, ErrConflict) {
			t.Errorf("name taken in the team: %v", err)
		}
		if err := s.CreateVolume(ctx, volume("v1", "team2", "other")); !errors.Is(err, ErrConflict) {
			t.Errorf("ID taken: %v", err)
		}
		if err := s.CreateVolume(ctx, volume("v3", "team2", "data")); err != nil {
			t.Errorf("the same name in another team: %v", err)
		}
		if err := s.CreateVolume(ctx, volume("v4", "", "x")); err == nil {
			t.Error("a volume without a team was recorded")
		}
		if got, err := s.GetVolume(ctx, "team1", "v1"); err != nil || got != v {
			t.Errorf("GetVolume = %+v %v", got, err)
		}
		for _, team := range []string{"team2", ""} {
			if _, err := s.GetVolume(ctx, team, "v1"); !errors.Is(err, ErrNotFound) {
				t.Errorf("GetVolume from team %q: %v", team, err)
			}
			if _, err := s.VolumeByName(ctx, team, "nope"); !errors.Is(err, ErrNotFound) {
				t.Errorf("VolumeByName from team %q: %v", team, err)
			}
		}
		if got, err := s.VolumeByName(ctx, "team2", "data"); err != nil || got.ID != "v3" {
			t.Errorf("VolumeByName = %+v %v", got, err)
		}
		if got, err := s.VolumeByID(ctx, "v3"); err != nil || got.TeamID != "team2" {
			t.Errorf("VolumeByID = %+v %v", got, err)
		}
		if list, err := s.ListVolumes(ctx, "team1"); err != nil || len(list) != 1 || list[0] != v {
			t.Errorf("ListVolumes = %+v %v", list, err)
		}
		if list, err := s.ListVolumes(ctx, ""); err != nil || len(list) != 0 {
			t.Errorf("ListVolumes of no team = %+v %v", list, err)
		}
		if err := s.DeleteVolume(ctx, "team2", "v1", nil); !errors.Is(err, ErrNotFound) {
			t.Errorf("another team deleted v1: %v", err)
		}
		if err := s.DeleteVolume(ctx, "team1", "v1", nil); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteVolume(ctx, "team1", "v1", nil); !errors.Is(err, ErrNotFound) {
			t.Errorf("second delete: %v", err)
		}
	})
}

func TestSandboxVolumeMounts(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "a", CreatedAt: t0})
		s.CreateTeam(ctx, Team{ID: "team2", Name: "b", CreatedAt: t0})
		s.CreateVolume(ctx, volume("v1", "team1", "one"))
		s.CreateVolume(ctx, volume("v2", "team1", "two"))
		s.CreateVolume(ctx, volume("vx", "team2", "theirs"))

		sb := sandbox("sb1", t0, nil)
		sb.VolumeMounts = []VolumeMount{{VolumeID: "v1", Name: "one", Path: "/data"}, {VolumeID: "v2", Name: "two", Path: "/mnt/two"}}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSandbox(ctx, "sb1")
		if err != nil || !reflect.DeepEqual(got.VolumeMounts, sb.VolumeMounts) {
			t.Errorf("mounts round trip: %+v %v", got.VolumeMounts, err)
		}
		// Updates keep them.
		upd, err := s.UpdateSandbox(ctx, "sb1", func(x *Sandbox) error { x.State = StatePaused; return nil })
		if err != nil || !reflect.DeepEqual(upd.VolumeMounts, sb.VolumeMounts) {
			t.Errorf("after an update: %+v %v", upd.VolumeMounts, err)
		}
		for name, vol := range map[string]string{"another team's": "vx", "unknown": "nope"} {
			bad := sandbox("sb-"+vol, t0, nil)
			bad.VolumeMounts = []VolumeMount{{VolumeID: "v1", Name: "one", Path: "/a"}, {VolumeID: vol, Name: "x", Path: "/b"}}
			if err := s.CreateSandbox(ctx, bad); !errors.Is(err, ErrNotFound) {
				t.Errorf("a sandbox mounting %s volume: %v", name, err)
			}
			if _, err := s.GetSandbox(ctx, bad.ID); !errors.Is(err, ErrNotFound) {
				t.Errorf("the refused sandbox mounting %s volume was recorded", name)
			}
		}
		plain := sandbox("sb2", t0, nil)
		s.CreateSandbox(ctx, plain)
		if got, _ := s.GetSandbox(ctx, "sb2"); got.VolumeMounts != nil {
			t.Errorf("a sandbox without mounts has %+v", got.VolumeMounts)
		}

		// In use while paused: the error names the sandbox, and the stage
		// does not run.
		staged := false
		err = s.DeleteVolume(ctx, "team1", "v2", func() error { staged = true; return nil })
		var inUse *VolumeInUseError
		if !errors.As(err, &inUse) || !errors.Is(err, ErrInUse) || !reflect.DeepEqual(inUse.SandboxIDs, []string{"sb1"}) || staged {
			t.Errorf("delete of a mounted volume: %v (staged %v)", err, staged)
		}
		// A stage that fails aborts the deletion.
		s.UpdateSandbox(ctx, "sb1", func(x *Sandbox) error { x.State = StateKilled; return nil })
		boom := errors.New("boom")
		if err := s.DeleteVolume(ctx, "team1", "v2", func() error { return boom }); !errors.Is(err, boom) {
			t.Errorf("failed stage: %v", err)
		}
		if _, err := s.GetVolume(ctx, "team1", "v2"); err != nil {
			t.Errorf("a failed stage deleted the volume: %v", err)
		}
		// A killed sandbox holds nothing.
		if err := s.DeleteVolume(ctx, "team1", "v2", func() error { staged = true; return nil }); err != nil || !staged {
			t.Errorf("delete of a volume only a killed sandbox mounted: %v (staged %v)", err, staged)
		}
	})
}

// TestVolumeDeleteRacesMount runs a volume's deletion against the
// creation of a sandbox that mounts it: either the sandbox is refused or
// the deletion is, never both succeed.
func TestVolumeDeleteRacesMount(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		s.CreateTeam(ctx, Team{ID: "team1", Name: "a", CreatedAt: t0})
		var deleted, mounted int
		for i := 0; i < 30; i++ {
			vid, sid := fmt.Sprintf("v%d", i), fmt.Sprintf("sb%d", i)
			if err := s.CreateVolume(ctx, volume(vid, "team1", vid)); err != nil {
				t.Fatal(err)
			}
			sb := sandbox(sid, t0, nil)
			sb.VolumeMounts = []VolumeMount{{VolumeID: vid, Name: vid, Path: "/data"}}
			var wg sync.WaitGroup
			var createErr, deleteErr error
			wg.Add(2)
			go func() { defer wg.Done(); createErr = s.CreateSandbox(ctx, sb) }()
			go func() { defer wg.Done(); deleteErr = s.DeleteVolume(ctx, "team1", vid, nil) }()
			wg.Wait()
			switch {
			case createErr == nil && deleteErr == nil:
				t.Fatalf("round %d: both the mount and the deletion succeeded", i)
			case createErr == nil && errors.Is(deleteErr, ErrInUse):
				mounted++
			case errors.Is(createErr, ErrNotFound) && deleteErr == nil:
				deleted++
			default:
				t.Fatalf("round %d: create %v, delete %v", i, createErr, deleteErr)
			}
		}
		t.Logf("sandbox first %d times, deletion first %d times", mounted, deleted)
	})
}
