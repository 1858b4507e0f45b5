package scale

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// The simulated cluster at a small size: creates through both api
// replicas spread over the nodes, the pages of GET /v2/sandboxes list
// every sandbox once with X-Total-Running the count of the running ones,
// and the sandboxes of a node that stops heartbeating leave the listing
// and its count and answer 404, while the pages still list all the
// others (a page cut short by a lost node's sandboxes once ended the
// listing there).
func TestSimulatedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server")
	}
	c := newSimCluster(t, simConfig{Nodes: 4, APIs: 2, Heartbeat: 500 * time.Millisecond})
	c.seed(t, 30, 90)
	placed := map[string]int{}
	for i := range 40 {
		id, err := c.create(i)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := c.st.GetSandbox(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		placed[rec.Node]++
	}
	if len(placed) != 4 {
		t.Errorf("40 creates placed on %v, want all 4 nodes", placed)
	}
	listAll := func() (seen map[string]bool, total string) {
		t.Helper()
		seen = map[string]bool{}
		q := "limit=37"
		for range 20 {
			code, body, h, err := c.do(0, "GET", "/v2/sandboxes?"+q, "")
			if err != nil || code != http.StatusOK {
				t.Fatalf("list: %d %s %v", code, body, err)
			}
			if total == "" {
				total = h.Get("X-Total-Running")
			}
			for _, id := range idsOf(t, body) {
				if seen[id] {
					t.Errorf("%s listed twice", id)
				}
				seen[id] = true
			}
			next := h.Get("X-Next-Token")
			if next == "" {
				break
			}
			q = "limit=37&nextToken=" + next
		}
		return seen, total
	}
	seen, total := listAll()
	if len(seen) != 160 || total != "70" {
		t.Errorf("listed %d sandboxes, X-Total-Running %s; want 160 and 70", len(seen), total)
	}

	// sim000 stops heartbeating (its member closes): once lost, its
	// sandboxes are gone to the api.
	c.members["sim000"].Close()
	delete(c.members, "sim000")
	onLost, err := c.st.ListSandboxes(context.Background(), store.SandboxFilter{Teams: store.AllTeams(), Node: "sim000"})
	if err != nil || len(onLost) == 0 {
		t.Fatalf("sandboxes on sim000: %d %v", len(onLost), err)
	}
	running := 0
	for _, r := range onLost {
		if r.State == store.StateRunning {
			running++
		}
	}
	time.Sleep(11 * time.Second) // cluster.DefaultLostAfter, and the api's node cache
	seen, total = listAll()
	if want := 160 - len(onLost); len(seen) != want || total != fmt.Sprint(70-running) {
		t.Errorf("after sim000 was lost: listed %d, X-Total-Running %s; want %d and %d", len(seen), total, want, 70-running)
	}
	if code, body, _, _ := c.do(1, "GET", "/sandboxes/"+onLost[0].ID, ""); code != http.StatusNotFound {
		t.Errorf("a sandbox of the lost node: %d %s, want 404", code, body)
	}
}

func idsOf(t *testing.T, body []byte) []string {
	t.Helper()
	var out []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := jsonUnmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(out))
	for i, o := range out {
		ids[i] = o.SandboxID
	}
	return ids
}
