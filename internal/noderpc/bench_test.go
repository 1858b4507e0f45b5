package noderpc

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	"github.com/warren-sandbox/warren/proto/node/v1/nodev1connect"
)

// connecting is a node whose Connect answers a sandbox's record at once.
type connecting struct{ Sandboxes }

func (connecting) Connect(_ context.Context, tid team.ID, id string, _ time.Duration, _ bool) (store.Sandbox, bool, error) {
	teamID := tid.String()
	return store.Sandbox{ID: id, TeamID: teamID, TemplateID: "base", State: store.StateRunning, CPUCount: 2, MemoryMB: 512,
		EnvdVersion: "0.1.0", EnvdAccessToken: strings.Repeat("t", 32), StartedAt: time.Unix(1_800_000_000, 0)}, false, nil
}

// BenchmarkNodeServiceCall is the cost of the cluster's authentication on
// a NodeService call (Connect, its record in the answer) over loopback:
// a Client to the service alone ("plain"), and to a node's Handler with
// the request and answer signed and checked ("signed"). p50 and p99 are
// of the calls' times.
func BenchmarkNodeServiceCall(b *testing.B) {
	auth, err := cluster.NewAuth([]byte(strings.Repeat("b", 32)))
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(nodev1connect.NewNodeServiceHandler(newService(connecting{})))
	plain := httptest.NewServer(mux)
	defer plain.Close()
	signed := httptest.NewServer(Handler(Served{Sandboxes: connecting{}, Teams: &StoreTeams{Store: &teamStore{teams: map[string]bool{"t1": true}}}}, auth.Guard("n1")))
	defer signed.Close()
	plainTransport := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	for _, c := range []struct {
		name      string
		url       string
		transport http.RoundTripper
	}{
		{"plain", plain.URL, plainTransport},
		{"signed", signed.URL, NewTransport(auth)},
	} {
		b.Run(c.name, func(b *testing.B) {
			cl := NewClient("n1", strings.TrimPrefix(c.url, "http://"), c.transport)
			ctx := context.Background()
			times := make([]time.Duration, 0, b.N)
			for b.Loop() {
				t0 := time.Now()
				if _, _, err := cl.Connect(ctx, team.MustParse("t1"), "sbx1", time.Minute, false); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(t0))
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs")
		})
	}
}
