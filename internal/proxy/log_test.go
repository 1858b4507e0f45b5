package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/reqid"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// loggingNode logs with the request's context, as the sandbox manager
// does when the proxy resolves or resumes a sandbox.
type loggingNode struct {
	*fakeNode
	log *slog.Logger
}

func (n loggingNode) Resolve(ctx context.Context, id string) (Target, error) {
	n.log.InfoContext(ctx, "resolving", "sandbox", id)
	return n.fakeNode.Resolve(ctx, id)
}

// A proxied request's log lines, in JSON, name its ID exactly once, the
// one its 500 names.
func TestLogLinesNameTheProxiedRequest(t *testing.T) {
	n, _, _ := newFakeNode(t)
	n.err = errors.New("runc state: open /run/warren/runc/x/state.json: permission denied")
	buf := &testenv.Buffer{}
	log := slog.New(slog.NewJSONHandler(buf, nil)) // New adds the request IDs
	p := New(Config{Domain: "localhost", Resolver: loggingNode{n, reqid.Logger(log)}, Logger: log})

	w := serve(p, "192.0.2.1:1", "8000-broken.localhost")
	id := w.Header().Get(reqid.Header)
	if w.Code != 500 || strings.TrimSpace(w.Body.String()) != fmt.Sprintf(`{"code":500,"message":"internal error (request %s)"}`, id) {
		t.Fatalf("%d %s (ID %q)", w.Code, w.Body, id)
	}
	var msgs []string
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		if line[reqid.LogKey] != id || strings.Count(l, `"`+reqid.LogKey+`"`) != 1 {
			t.Errorf("log line does not name the request %s once: %s", id, l)
		}
		msgs = append(msgs, fmt.Sprint(line["msg"]))
	}
	if strings.Join(msgs, ",") != "resolving,proxy request failed" {
		t.Errorf("lines %q, want the resolver's and the 500's", msgs)
	}

	// Another request: another ID, on its own lines.
	w2 := serve(p, "192.0.2.1:1", "8000-broken.localhost")
	if id2 := w2.Header().Get(reqid.Header); id2 == "" || id2 == id || strings.Count(buf.String(), id2) != 2 {
		t.Errorf("second request's ID %q (first %q):\n%s", id2, id, buf.String())
	}
}
