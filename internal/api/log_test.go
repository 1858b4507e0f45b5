package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/reqid"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// loggingSandboxes logs with the request's context, as the sandbox
// manager does below the API, and then fails.
type loggingSandboxes struct {
	*fakeSandboxes
	log *slog.Logger
}

func (l loggingSandboxes) Create(ctx context.Context, req sandbox.CreateRequest) (store.Sandbox, error) {
	l.log.InfoContext(ctx, "starting a sandbox", "template", req.TemplateID)
	return store.Sandbox{}, fmt.Errorf("sandbox: starting: %s", leak)
}

// A request's log lines, in JSON, are valid JSON objects that name the
// request's ID, the one the 500's body and header give the client; lines
// logged below the API with the request's context name it too.
func TestLogLinesNameTheRequest(t *testing.T) {
	buf := &testenv.Buffer{}
	log := slog.New(slog.NewJSONHandler(buf, nil)) // api.New adds the request IDs
	fakes := &fakeSandboxes{}
	hs := newHarness(t, Config{Logger: log, Sandboxes: loggingSandboxes{fakes, reqid.Logger(log)}})

	w := hs.do("POST", "/sandboxes", keyTeam1, `{"templateID":"base"}`)
	if w.Code != 500 {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	var body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	var bodyID string
	msg := strings.TrimPrefix(body.Message, placePrefix+"sandbox creation failed, please retry; ")
	if _, err := fmt.Sscanf(msg, "internal error (request %16s)", &bodyID); err != nil || len(bodyID) != 16 {
		t.Fatalf("500 body %q names no request ID (%v)", body.Message, err)
	}
	if h := w.Header().Get(RequestIDHeader); h != bodyID {
		t.Errorf("header ID %q, body ID %q", h, bodyID)
	}

	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		if line[reqid.LogKey] != bodyID {
			t.Errorf("log line without the request's ID %s: %s", bodyID, l)
		}
		if strings.Count(l, `"`+reqid.LogKey+`"`) != 1 {
			t.Errorf("log line names the request more than once: %s", l)
		}
		seen[line["msg"].(string)] = true
		if line["msg"] == "API request failed" && !strings.Contains(fmt.Sprint(line["err"]), "permission denied") {
			t.Errorf("the 500's line lacks the detail: %s", l)
		}
	}
	if !seen["starting a sandbox"] || !seen["API request failed"] {
		t.Errorf("lines missing (want the manager's and the 500's): %s", buf.String())
	}
}
