package noderpc

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	nodev1 "github.com/warren-sandbox/warren/proto/node/v1"
	"github.com/warren-sandbox/warren/proto/node/v1/nodev1connect"
)

// everyTeam says every team exists, the empty one too: what keeps an
// empty team from the manager is then the guard's own check alone.
type everyTeam struct{}

func (everyTeam) TeamExists(context.Context, string) (bool, error) { return true, nil }

// fuzzProcedures are NodeService's procedures with a request each, the
// seeds of FuzzNodeService.
var fuzzProcedures = []struct {
	path string
	seed proto.Message
}{
	{nodev1connect.NodeServiceCreateSandboxProcedure, &nodev1.CreateSandboxRequest{TeamId: "team-a", TemplateId: "base", TimeoutMs: 1000,
		Metadata: map[string]string{"k": "v"}, EnvVars: map[string]string{"A": "b"}, VolumeMounts: []*nodev1.VolumeMount{{Name: "v", Path: "/data"}},
		ExtraJson: `{"network":{"egressProxy":{"url":"http://198.18.0.1:3128"}}}`, EgressProxyPassword: "pw", RequestId: "0123abcd"}},
	{nodev1connect.NodeServiceAbandonCreateProcedure, &nodev1.AbandonCreateRequest{TeamId: "team-a", RequestId: "0123abcd"}},
	{nodev1connect.NodeServiceKillSandboxProcedure, &nodev1.KillSandboxRequest{TeamId: "team-a", SandboxId: "sb"}},
	{nodev1connect.NodeServiceSetTimeoutProcedure, &nodev1.SetTimeoutRequest{TeamId: "team-a", SandboxId: "sb", TimeoutMs: 1000}},
	{nodev1connect.NodeServiceRefreshProcedure, &nodev1.RefreshRequest{TeamId: "team-a", SandboxId: "sb", DurationMs: 1000}},
	{nodev1connect.NodeServiceConnectProcedure, &nodev1.ConnectRequest{TeamId: "team-a", SandboxId: "sb", TimeoutMs: 1000, Memory: true}},
	{nodev1connect.NodeServicePauseProcedure, &nodev1.PauseRequest{TeamId: "team-a", SandboxId: "sb", KeepMemory: true}},
	{nodev1connect.NodeServiceResumeProcedure, &nodev1.ResumeRequest{TeamId: "team-a", SandboxId: "sb", TimeoutMs: 1000}},
	{nodev1connect.NodeServiceForkProcedure, &nodev1.ForkRequest{TeamId: "team-a", SandboxId: "sb", TimeoutMs: 1000, Count: 2}},
	{nodev1connect.NodeServiceMetricsProcedure, &nodev1.MetricsRequest{TeamId: "team-a", SandboxId: "sb", StartUnixMs: 1, EndUnixMs: 2}},
	{nodev1connect.NodeServiceLogsProcedure, &nodev1.LogsRequest{TeamId: "team-a", SandboxId: "sb", Limit: 10}},
	{nodev1connect.NodeServiceUpdateNetworkProcedure, &nodev1.UpdateNetworkRequest{TeamId: "team-a", SandboxId: "sb",
		UpdateJson: `{"egressProxy":{"url":"http://198.18.0.1:3128"}}`, EgressProxyPassword: "pw"}},
	{nodev1connect.NodeServiceNetworkLogsProcedure, &nodev1.LogsRequest{TeamId: "team-a", SandboxId: "sb", Limit: 10}},
}

// FuzzNodeService sends arbitrary bytes as the body of each NodeService
// procedure, in Connect's proto and JSON encodings: the handler never
// panics, and the sandbox manager never sees a call without a team.
func FuzzNodeService(f *testing.F) {
	if len(fuzzProcedures) != len(everyRPC) {
		f.Fatalf("%d procedures fuzzed, NodeService has %d", len(fuzzProcedures), len(everyRPC))
	}
	for i, p := range fuzzProcedures {
		b, err := proto.Marshal(p.seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), false, b)
		j, err := protojson.Marshal(p.seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), true, j)
		f.Add(uint8(i), true, bytes.Replace(j, []byte(`"team-a"`), []byte(`""`), 1))
		f.Add(uint8(i), false, b[len("team-a")+2:]) // the team's field cut off
	}
	f.Add(uint8(0), true, []byte(`{"teamId":"team-a","teamId":""}`))
	f.Add(uint8(1), false, []byte{0x0a, 0x00, 0x0a, 0x01, 'x', 0x0a, 0x00})
	sbs := &fakeSandboxes{}
	path, h := nodeService(Served{Sandboxes: sbs, Teams: everyTeam{}})
	mux := http.NewServeMux()
	mux.Handle(path, h)
	f.Fuzz(func(t *testing.T, proc uint8, asJSON bool, body []byte) {
		p := fuzzProcedures[int(proc)%len(fuzzProcedures)]
		req := httptest.NewRequest(http.MethodPost, p.path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/proto")
		if asJSON {
			req.Header.Set("Content-Type", "application/json")
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		for _, team := range sbs.seenTeams() {
			if team == "" {
				t.Fatalf("%s reached the sandbox manager without a team (status %d)", p.path, w.Code)
			}
		}
	})
}
