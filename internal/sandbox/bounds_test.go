package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// bareManager is a manager of st with one live sandbox, "sb1" of team
// t1, and nothing else (no node, no images): what the checks that come
// before anything is done need. A call that gets past them panics, which
// the tests report as such.
func bareManager(t *testing.T) (*Manager, store.Store) {
	t.Helper()
	st := newStore(t)
	ctx := context.Background()
	if err := st.CreateTeam(ctx, store.Team{ID: "t2", Name: "t2", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, r := range []store.Sandbox{
		{ID: "sb1", TeamID: "t1", TemplateID: "base", State: store.StateRunning, StartedAt: now, EndAt: now.Add(time.Minute)},
		{ID: "sb2", TeamID: "t2", TemplateID: "base", State: store.StateRunning, StartedAt: now, EndAt: now.Add(time.Minute)},
	} {
		if err := st.CreateSandbox(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	m := &Manager{cfg: Config{Store: st}, log: slog.New(slog.DiscardHandler), live: map[string]*live{
		"sb1": {id: "sb1", teamID: "t1"},
		"sb2": {id: "sb2", teamID: "t2"},
	}, perTeam: map[string]int{}}
	return m, st
}

// safely runs fn, a panic turned into an error.
func safely(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked (got past the check): %v", r)
		}
	}()
	return fn()
}

// teamCalls are the manager's methods that act on one team's sandbox.
func teamCalls(m *Manager, ctx context.Context) map[string]func(tm team.ID, id string) error {
	return map[string]func(tm team.ID, id string) error{
		"Get":        func(tm team.ID, id string) error { _, err := m.Get(ctx, tm, id); return err },
		"Kill":       func(tm team.ID, id string) error { return m.Kill(ctx, tm, id) },
		"SetTimeout": func(tm team.ID, id string) error { return m.SetTimeout(ctx, tm, id, time.Hour) },
		"Refresh":    func(tm team.ID, id string) error { return m.Refresh(ctx, tm, id, time.Hour) },
		"Connect":    func(tm team.ID, id string) error { _, _, err := m.Connect(ctx, tm, id, time.Minute, true); return err },
		"Pause":      func(tm team.ID, id string) error { _, err := m.Pause(ctx, tm, id, false); return err },
		"Resume": func(tm team.ID, id string) error {
			_, err := m.ResumeSandbox(ctx, tm, id, ResumeOptions{Timeout: time.Minute})
			return err
		},
		"Fork":     func(tm team.ID, id string) error { _, err := m.Fork(ctx, tm, id, time.Minute, 1); return err },
		"Snapshot": func(tm team.ID, id string) error { _, err := m.Snapshot(ctx, tm, id, "/nonexistent/x"); return err },
		"Metrics": func(tm team.ID, id string) error {
			_, err := m.Metrics(ctx, tm, id, time.Time{}, time.Now())
			return err
		},
		"Logs":          func(tm team.ID, id string) error { _, err := m.Logs(ctx, tm, id, time.Time{}, 10); return err },
		"UpdateNetwork": func(tm team.ID, id string) error { return m.UpdateNetwork(ctx, tm, id, NetworkUpdate{}) },
		"NetworkLogs":   func(tm team.ID, id string) error { _, err := m.NetworkLogs(ctx, tm, id, time.Time{}, 10); return err },
	}
}

// The zero team.ID (the one way left to name no team) matches no
// sandbox, whatever the call; another team's sandbox is not found either.
func TestEmptyTeamMatchesNothing(t *testing.T) {
	m, st := bareManager(t)
	ctx := context.Background()
	for name, call := range teamCalls(m, ctx) {
		for _, tm := range []team.ID{{}, team.MustParse("t2")} {
			if err := safely(func() error { return call(tm, "sb1") }); !errors.Is(err, ErrNotFound) {
				t.Errorf("%s(team %q, another team's sandbox): %v, want not found", name, tm, err)
			}
		}
	}
	if rec, err := st.GetSandbox(ctx, "sb1"); err != nil || rec.State != store.StateRunning || time.Until(rec.EndAt) > time.Minute {
		t.Errorf("the sandbox changed: %+v %v", rec, err)
	}
	for _, tm := range []team.ID{{}, team.MustParse("t3")} {
		got, err := m.List(ctx, tm, store.SandboxFilter{})
		if err != nil || len(got) != 0 {
			t.Errorf("List(team %q) = %d sandboxes, %v; want none", tm, len(got), err)
		}
		if n, err := m.CountSandboxes(ctx, tm, store.SandboxFilter{}); err != nil || n != 0 {
			t.Errorf("CountSandboxes(team %q) = %d, %v; want 0", tm, n, err)
		}
	}
	if got, err := m.List(ctx, team.MustParse("t1"), store.SandboxFilter{}); err != nil || len(got) != 1 || got[0].ID != "sb1" {
		t.Errorf("List(t1) = %v, %v", got, err)
	}
	if err := safely(func() error {
		_, err := m.Create(ctx, CreateRequest{TemplateID: "base", Timeout: time.Minute})
		return err
	}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Create without a team: %v, want invalid", err)
	}
}

// The manager applies the platform API's bounds itself: in a cluster its
// caller is a node's RPC, and the node believes nothing the api did not
// check.
func TestManagerAppliesTheAPIsBounds(t *testing.T) {
	m, st := bareManager(t)
	ctx := context.Background()
	big := func(n int) string { return strings.Repeat("x", n) }
	for name, req := range map[string]CreateRequest{
		"a timeout over the cap":  {Timeout: MaxTimeout + time.Second},
		"a negative timeout":      {Timeout: -time.Second},
		"metadata over 64 KiB":    {Metadata: map[string]string{"k": big(MaxMetadataBytes)}},
		"metadata in many pairs":  {Metadata: manyPairs(MaxMetadataBytes/16+1, 16)},
		"env vars over 256 KiB":   {EnvVars: map[string]string{"K": big(MaxEnvVarsBytes)}},
		"env vars in many pairs":  {EnvVars: manyPairs(MaxEnvVarsBytes/16+1, 16)},
		"an env name with =":      {EnvVars: map[string]string{"A=B": "c"}},
		"an empty env name":       {EnvVars: map[string]string{"": "c"}},
		"an env name with NUL":    {EnvVars: map[string]string{"A\x00": "c"}},
		"an env value with NUL":   {EnvVars: map[string]string{"A": "c\x00d"}},
		"a relative mount path":   {VolumeMounts: []VolumeMount{{Name: "v", Path: "data"}}},
		"a mount over /proc":      {VolumeMounts: []VolumeMount{{Name: "v", Path: "/proc/x"}}},
		"a mount over envd":       {VolumeMounts: []VolumeMount{{Name: "v", Path: "/opt/warren"}}},
		"an unclean mount path":   {VolumeMounts: []VolumeMount{{Name: "v", Path: "/data/../etc"}}},
		"a mount path with a NUL": {VolumeMounts: []VolumeMount{{Name: "v", Path: "/da\x00ta"}}},
	} {
		req.TeamID, req.TemplateID = team.MustParse("t1"), "base"
		if req.Timeout == 0 {
			req.Timeout = time.Minute
		}
		if err := safely(func() error { _, err := m.Create(ctx, req); return err }); !errors.Is(err, ErrInvalid) {
			t.Errorf("Create with %s: %v, want invalid", name, err)
		}
	}
	for name, call := range map[string]func() error{
		"SetTimeout over the cap": func() error { return m.SetTimeout(ctx, team.MustParse("t1"), "sb1", MaxTimeout+time.Second) },
		"Refresh over the cap":    func() error { return m.Refresh(ctx, team.MustParse("t1"), "sb1", MaxRefresh+time.Second) },
		"Refresh negative":        func() error { return m.Refresh(ctx, team.MustParse("t1"), "sb1", -time.Second) },
		"Connect over the cap": func() error {
			_, _, err := m.Connect(ctx, team.MustParse("t1"), "sb1", MaxTimeout+time.Second, true)
			return err
		},
		"Connect negative": func() error { _, _, err := m.Connect(ctx, team.MustParse("t1"), "sb1", -time.Second, true); return err },
		"Resume over the cap": func() error {
			_, err := m.ResumeSandbox(ctx, team.MustParse("t1"), "sb1", ResumeOptions{Timeout: MaxTimeout + time.Second})
			return err
		},
		"Resume negative": func() error {
			_, err := m.ResumeSandbox(ctx, team.MustParse("t1"), "sb1", ResumeOptions{Timeout: -time.Second})
			return err
		},
		"Fork over the cap": func() error {
			_, err := m.Fork(ctx, team.MustParse("t1"), "sb1", MaxTimeout+time.Second, 1)
			return err
		},
	} {
		if err := safely(call); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
	if rec, err := st.GetSandbox(ctx, "sb1"); err != nil || time.Until(rec.EndAt) > time.Minute {
		t.Errorf("the sandbox's end moved: %v %v", rec.EndAt, err)
	}
	// At the caps, a term is accepted.
	if err := m.SetTimeout(ctx, team.MustParse("t1"), "sb1", MaxTimeout); err != nil {
		t.Errorf("SetTimeout at the cap: %v", err)
	}
	if err := m.Refresh(ctx, team.MustParse("t1"), "sb1", MaxRefresh); err != nil {
		t.Errorf("Refresh at the cap: %v", err)
	}
}

func manyPairs(n, size int) map[string]string {
	out := map[string]string{}
	for i := range n {
		k := fmt.Sprintf("K%07d", i)
		out[k] = strings.Repeat("v", size-len(k))
	}
	return out
}

// otherTeamsVolumes finds every volume name, in team t2 whoever asks: a
// volume store that forgot its team scope.
type otherTeamsVolumes struct{}

func (otherTeamsVolumes) Resolve(_ context.Context, _, name string) (store.Volume, error) {
	return store.Volume{ID: "vol-" + name, TeamID: "t2", Name: name}, nil
}

func (otherTeamsVolumes) HostDir(_ context.Context, id string) (string, error) {
	return "/nonexistent/" + id, nil
}

// A volume the manager is handed mounts only if it is the team's own.
func TestMountsOnlyTheTeamsVolumes(t *testing.T) {
	m, _ := bareManager(t)
	m.cfg.Volumes = otherTeamsVolumes{}
	_, err := m.resolveMounts(context.Background(), "t1", []VolumeMount{{Name: "data", Path: "/data"}})
	if !errors.Is(err, ErrVolumeNotFound) {
		t.Errorf("another team's volume: %v, want volume not found", err)
	}
	if _, err := m.resolveMounts(context.Background(), "t2", []VolumeMount{{Name: "data", Path: "/data"}}); err != nil {
		t.Errorf("the team's own volume: %v", err)
	}
}

// Config.MaxTimeout (--max-sandbox-timeout) moves the bound.
func TestManagerMaxTimeoutIsTheOperators(t *testing.T) {
	m, _ := bareManager(t)
	ctx := context.Background()
	if err := m.SetTimeout(ctx, team.MustParse("t1"), "sb1", MaxTimeout+time.Hour); !errors.Is(err, ErrInvalid) {
		t.Errorf("25 h by default: %v", err)
	}
	m.cfg.MaxTimeout = 7 * 24 * time.Hour
	if err := m.SetTimeout(ctx, team.MustParse("t1"), "sb1", 7*24*time.Hour); err != nil {
		t.Errorf("7 days with a 7-day bound: %v", err)
	}
	if err := safely(func() error { return m.SetTimeout(ctx, team.MustParse("t1"), "sb1", 7*24*time.Hour+time.Second) }); !errors.Is(err, ErrInvalid) {
		t.Errorf("over a 7-day bound: %v", err)
	}
	if _, err := m.Fork(ctx, team.MustParse("t1"), "sb1", 8*24*time.Hour, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("a fork over the bound: %v", err)
	}
}
