package noderpc

import (
	"context"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
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
	f.saw("Create", req.TeamID)
	return store.Sandbox{ID: "sb1", TeamID: req.TeamID}, nil
}

func (f *fakeSandboxes) Get(_ context.Context, teamID, id string) (store.Sandbox, error) {
	f.saw("Get", teamID)
	return store.Sandbox{ID: id, TeamID: teamID}, nil
}

func (f *fakeSandboxes) List(_ context.Context, teamID string, _ store.SandboxFilter) ([]store.Sandbox, error) {
	f.saw("List", teamID)
	return nil, nil
}

func (f *fakeSandboxes) Kill(_ context.Context, teamID, _ string) error {
	f.saw("Kill", teamID)
	return nil
}

func (f *fakeSandboxes) SetTimeout(_ context.Context, teamID, _ string, _ time.Duration) error {
	f.saw("SetTimeout", teamID)
	return nil
}

func (f *fakeSandboxes) Refresh(_ context.Context, teamID, _ string, _ time.Duration) error {
	f.saw("Refresh", teamID)
	return nil
}

func (f *fakeSandboxes) Connect(_ context.Context, teamID, id string, _ time.Duration, _ bool) (store.Sandbox, bool, error) {
	f.saw("Connect", teamID)
	return store.Sandbox{ID: id, TeamID: teamID, EnvdAccessToken: "secret-token"}, false, nil
}

func (f *fakeSandboxes) Pause(_ context.Context, teamID, _ string, _ bool) (bool, error) {
	f.saw("Pause", teamID)
	return true, nil
}

func (f *fakeSandboxes) ResumeSandbox(_ context.Context, teamID, id string, _ sandbox.ResumeOptions) (store.Sandbox, error) {
	f.saw("ResumeSandbox", teamID)
	return store.Sandbox{ID: id, TeamID: teamID}, nil
}

func (f *fakeSandboxes) Fork(_ context.Context, teamID, _ string, _ time.Duration, count int) ([]sandbox.ForkResult, error) {
	f.saw("Fork", teamID)
	return make([]sandbox.ForkResult, min(max(count, 0), 4)), nil
}

func (f *fakeSandboxes) Metrics(_ context.Context, teamID, _ string, _, _ time.Time) ([]sandbox.Metric, error) {
	f.saw("Metrics", teamID)
	return nil, nil
}

func (f *fakeSandboxes) Logs(_ context.Context, teamID, _ string, _ time.Time, _ int) ([]sandbox.LogEntry, error) {
	f.saw("Logs", teamID)
	return nil, nil
}

func (f *fakeSandboxes) UpdateNetwork(_ context.Context, teamID, _ string, _ sandbox.NetworkUpdate) error {
	f.saw("UpdateNetwork", teamID)
	return nil
}

func (f *fakeSandboxes) NetworkLogs(_ context.Context, teamID, _ string, _ time.Time, _ int) ([]egress.Entry, error) {
	f.saw("NetworkLogs", teamID)
	return nil, nil
}

// fakeTeams is Teams of a fixed set.
type fakeTeams map[string]bool

func (t fakeTeams) TeamExists(_ context.Context, id string) (bool, error) { return t[id], nil }
