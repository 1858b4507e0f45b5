package noderpc

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/warren-sandbox/warren/internal/store"
	nodev1 "github.com/warren-sandbox/warren/proto/node/v1"
	"github.com/warren-sandbox/warren/proto/node/v1/nodev1connect"
)

// rpcCall calls one NodeService procedure naming team.
type rpcCall struct {
	name string
	call func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error
}

// everyRPC calls each NodeService procedure once.
var everyRPC = []rpcCall{
	{"CreateSandbox", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.CreateSandbox(ctx, connect.NewRequest(&nodev1.CreateSandboxRequest{TeamId: team, TemplateId: "base"}))
		return err
	}},
	{"AbandonCreate", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.AbandonCreate(ctx, connect.NewRequest(&nodev1.AbandonCreateRequest{TeamId: team, RequestId: "r1"}))
		return err
	}},
	{"KillSandbox", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.KillSandbox(ctx, connect.NewRequest(&nodev1.KillSandboxRequest{TeamId: team, SandboxId: "victim"}))
		return err
	}},
	{"SetTimeout", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.SetTimeout(ctx, connect.NewRequest(&nodev1.SetTimeoutRequest{TeamId: team, SandboxId: "victim", TimeoutMs: 1000}))
		return err
	}},
	{"Refresh", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.Refresh(ctx, connect.NewRequest(&nodev1.RefreshRequest{TeamId: team, SandboxId: "victim", DurationMs: 1000}))
		return err
	}},
	{"Connect", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.Connect(ctx, connect.NewRequest(&nodev1.ConnectRequest{TeamId: team, SandboxId: "victim", TimeoutMs: 1000}))
		return err
	}},
	{"Pause", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.Pause(ctx, connect.NewRequest(&nodev1.PauseRequest{TeamId: team, SandboxId: "victim"}))
		return err
	}},
	{"Resume", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.Resume(ctx, connect.NewRequest(&nodev1.ResumeRequest{TeamId: team, SandboxId: "victim", TimeoutMs: 1000}))
		return err
	}},
	{"Fork", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.Fork(ctx, connect.NewRequest(&nodev1.ForkRequest{TeamId: team, SandboxId: "victim", TimeoutMs: 1000, Count: 1}))
		return err
	}},
	{"Metrics", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.Metrics(ctx, connect.NewRequest(&nodev1.MetricsRequest{TeamId: team, SandboxId: "victim"}))
		return err
	}},
	{"Logs", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.Logs(ctx, connect.NewRequest(&nodev1.LogsRequest{TeamId: team, SandboxId: "victim"}))
		return err
	}},
	{"UpdateNetwork", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.UpdateNetwork(ctx, connect.NewRequest(&nodev1.UpdateNetworkRequest{TeamId: team, SandboxId: "victim", UpdateJson: "{}"}))
		return err
	}},
	{"NetworkLogs", func(ctx context.Context, c nodev1connect.NodeServiceClient, team string) error {
		_, err := c.NetworkLogs(ctx, connect.NewRequest(&nodev1.LogsRequest{TeamId: team, SandboxId: "victim"}))
		return err
	}},
}

func TestEveryRPCIsCovered(t *testing.T) {
	methods := nodev1.File_node_v1_node_proto.Services().ByName("NodeService").Methods()
	if methods.Len() != len(everyRPC) {
		t.Fatalf("NodeService has %d methods, the tests call %d: add the new ones to everyRPC and to the fuzz target", methods.Len(), len(everyRPC))
	}
	for _, c := range everyRPC {
		if methods.ByName(protoName(c.name)) == nil {
			t.Errorf("NodeService has no method %s", c.name)
		}
	}
}

func protoName(s string) protoreflect.Name { return protoreflect.Name(s) }

// TestEveryRPCNeedsAKnownTeam: a call naming no team, a malformed one
// (team.Parse refuses it), or a team that does not exist, is refused
// before the sandbox manager sees it, on every procedure, in both of
// Connect's encodings.
func TestEveryRPCNeedsAKnownTeam(t *testing.T) {
	sbs := &fakeSandboxes{}
	path, h := nodeService(Served{Sandboxes: sbs, Teams: fakeTeams{"team-a": true}})
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()
	for _, codec := range []struct {
		name string
		opts []connect.ClientOption
	}{{"proto", nil}, {"json", []connect.ClientOption{connect.WithProtoJSON()}}} {
		c := nodev1connect.NewNodeServiceClient(srv.Client(), srv.URL, codec.opts...)
		for _, rpc := range everyRPC {
			for _, team := range []string{"", "team/../a", "team-ghost"} {
				err := rpc.call(ctx, c, team)
				var ce *connect.Error
				switch {
				case err == nil:
					t.Errorf("%s %s with team %q: accepted", codec.name, rpc.name, team)
				case !errors.As(err, &ce):
					t.Errorf("%s %s with team %q: %v", codec.name, rpc.name, team, err)
				case team != "team-ghost" && ce.Code() != connect.CodeInvalidArgument:
					t.Errorf("%s %s with no team or a malformed one (%q): %v, want invalid_argument", codec.name, rpc.name, team, err)
				case team == "team-ghost" && ce.Code() != connect.CodeNotFound:
					t.Errorf("%s %s with an unknown team: %v, want not_found", codec.name, rpc.name, err)
				}
				if got := sbs.seen(); len(got) > 0 {
					t.Errorf("%s %s with team %q reached the sandbox manager: %v", codec.name, rpc.name, team, got)
				}
			}
			if err := rpc.call(ctx, c, "team-a"); err != nil {
				t.Errorf("%s %s with a known team: %v", codec.name, rpc.name, err)
			}
			got := sbs.seen()
			if rpc.name == "AbandonCreate" { // of a create never made: nothing to kill
				if len(got) != 0 {
					t.Errorf("%s %s of no create: the manager saw %v", codec.name, rpc.name, got)
				}
				continue
			}
			if len(got) != 1 || got[0][len(got[0])-len(" team-a"):] != " team-a" {
				t.Errorf("%s %s with a known team: the manager saw %v", codec.name, rpc.name, got)
			}
		}
	}
}

// TestNoTeamsRefusesAll: a node served without Teams fails closed.
func TestNoTeamsRefusesAll(t *testing.T) {
	sbs := &fakeSandboxes{}
	path, h := nodeService(Served{Sandboxes: sbs})
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := nodev1connect.NewNodeServiceClient(srv.Client(), srv.URL)
	for _, rpc := range everyRPC {
		if err := rpc.call(context.Background(), c, "team-a"); err == nil {
			t.Errorf("%s without Teams: accepted", rpc.name)
		}
	}
	if got := sbs.seen(); len(got) > 0 {
		t.Errorf("the manager saw %v", got)
	}
}

// teamStore counts reads of teams.
type teamStore struct {
	teams map[string]bool
	reads int
}

func (s *teamStore) GetTeam(_ context.Context, id string) (store.Team, error) {
	s.reads++
	if !s.teams[id] {
		return store.Team{}, store.ErrNotFound
	}
	return store.Team{ID: id}, nil
}

func TestStoreTeams(t *testing.T) {
	st := &teamStore{teams: map[string]bool{"a": true}}
	teams := &StoreTeams{Store: st}
	ctx := context.Background()
	for _, c := range []struct {
		id   string
		want bool
	}{{"a", true}, {"a", true}, {"", false}, {"b", false}, {"b", false}} {
		got, err := teams.TeamExists(ctx, c.id)
		if err != nil || got != c.want {
			t.Errorf("TeamExists(%q) = %v, %v; want %v", c.id, got, err, c.want)
		}
	}
	// "a" is read once and remembered; "b" each time; "" never.
	if st.reads != 3 {
		t.Errorf("%d store reads, want 3", st.reads)
	}
}
