package noderpc

import (
	"context"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// fakeSandboxes is a sandbox manager that only records the teams it is
// asked about, and answers as if every call succeeded.
type fakeSandboxes struct {
	mu    sync.Mutex
	calls []string // "Method team"
	teams []string // the team of each call
}

func (f *fakeSandboxes) saw(method, teamID string) {
	f.mu.Lock()
	f.calls = append(f.calls, method+" "+teamID)
	f.teams = append(f.teams, teamID)
	f.mu.Unlock()
}

// seen returns the calls so far and forgets them.
func (f *fakeSandboxes) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls, f.teams = nil, nil
	return c
}

// seenTeams returns the teams of the calls so far and forgets them.
func (f *fakeSandboxes) seenTeams() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.teams
	f.calls, f.teams = nil, nil
	return t
}

var _ Sandboxes = (*fakeSandboxes)(nil)

func (f *fakeSandboxes) Create(_ context.Context, req sandbox.CreateRequest) (store.Sandbox, error) {
	f.saw("Create", req.TeamID.String())
	return store.Sandbox{ID: "sb1", TeamID: req.TeamID.String()}, nil
}

func (f *fakeSandboxes) Get(_ context.Context, tid team.ID, id string) (store.Sandbox, error) {
	teamID := tid.String()
	f.saw("Get", teamID)
	return store.Sandbox{ID: id, TeamID: teamID}, nil
}

func (f *fakeSandboxes) List(_ context.Context, tid team.ID, _ store.SandboxFilter) ([]store.Sandbox, error) {
	teamID := tid.String()
	f.saw("List", teamID)
	return nil, nil
}

func (f *fakeSandboxes) Kill(_ context.Context, tid team.ID, _ string) error {
	teamID := tid.String()
	f.saw("Kill", teamID)
	return nil
}

func (f *fakeSandboxes) SetTimeout(_ context.Context, tid team.ID, _ string, _ time.Duration) error {
	teamID := tid.String()
	f.saw("SetTimeout", teamID)
	return nil
}

func (f *fakeSandboxes) Refresh(_ context.Context, tid team.ID, _ string, _ time.Duration) error {
	teamID := tid.String()
	f.saw("Refresh", teamID)
	return nil
}

func (f *fakeSandboxes) Connect(_ context.Context, tid team.ID, id string, _ time.Duration, _ bool) (store.Sandbox, bool, error) {
	teamID := tid.String()
	f.saw("Connect", teamID)
	return store.Sandbox{ID: id, TeamID: teamID, EnvdAccessToken: "secret-token"}, false, nil
}

func (f *fakeSandboxes) Pause(_ context.Context, tid team.ID, _ string, _ bool) (bool, error) {
	teamID := tid.String()
	f.saw("Pause", teamID)
	return true, nil
}

func (f *fakeSandboxes) ResumeSandbox(_ context.Context, tid team.ID, id string, _ sandbox.ResumeOptions) (store.Sandbox, error) {
	teamID := tid.String()
	f.saw("ResumeSandbox", teamID)
	return store.Sandbox{ID: id, TeamID: teamID}, nil
}

func (f *fakeSandboxes) Fork(_ context.Context, tid team.ID, _ string, _ time.Duration, count int) ([]sandbox.ForkResult, error) {
	teamID := tid.String()
	f.saw("Fork", teamID)
	return make([]sandbox.ForkResult, min(max(count, 0), 4)), nil
}

func (f *fakeSandboxes) Metrics(_ context.Context, tid team.ID, _ string, _, _ time.Time) ([]sandbox.Metric, error) {
	teamID := tid.String()
	f.saw("Metrics", teamID)
	return nil, nil
}

func (f *fakeSandboxes) Logs(_ context.Context, tid team.ID, _ string, _ time.Time, _ int) ([]sandbox.LogEntry, error) {
	teamID := tid.String()
	f.saw("Logs", teamID)
	return nil, nil
}

func (f *fakeSandboxes) UpdateNetwork(_ context.Context, tid team.ID, _ string, _ sandbox.NetworkUpdate) error {
	teamID := tid.String()
	f.saw("UpdateNetwork", teamID)
	return nil
}

func (f *fakeSandboxes) NetworkLogs(_ context.Context, tid team.ID, _ string, _ time.Time, _ int) ([]egress.Entry, error) {
	teamID := tid.String()
	f.saw("NetworkLogs", teamID)
	return nil, nil
}

// fakeTeams is Teams of a fixed set.
type fakeTeams map[string]bool

func (t fakeTeams) TeamExists(_ context.Context, id string) (bool, error) { return t[id], nil }
