package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// TestStartFailuresCarryE2BsErrorCode: each cause of a failed create,
// resume, connect or fork gets E2B's status and error_code; the failures
// E2B names no cause for (a missing template, a full disk) carry none,
// and neither does any other call.
func TestStartFailuresCarryE2BsErrorCode(t *testing.T) {
	causes := []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"no room", fmt.Errorf("%w: this node runs 10 sandboxes", sandbox.ErrNoCapacity), 503, CodeCapacityUnavailable},
		{"node unavailable", fmt.Errorf("%w: node n2", sandbox.ErrNodeUnavailable), 503, CodeCapacityUnavailable},
		{"timed out", fmt.Errorf("asking node n2: %w", context.DeadlineExceeded), 504, CodePlacementTimeout},
		{"start failed", errors.New("runsc: exit status 1"), 500, CodeCreateFailed},
		{"resume step failed", &sandbox.ResumeError{ID: "sbx1", Step: "restore", Err: errors.New("x")}, 500, CodeCreateFailed},
		{"disk full", fmt.Errorf("%w: %w: below the reserve", sandbox.ErrNoCapacity, sandbox.ErrDiskFull), 507, ""},
		{"no template", fmt.Errorf("%w: nope", sandbox.ErrTemplateNotFound), 404, ""},
		{"bad request", fmt.Errorf("%w: bad", sandbox.ErrInvalid), 400, ""},
	}
	for _, c := range causes {
		hs := newHarness(t, Config{})
		hs.sandboxes.create = func(sandbox.CreateRequest) (store.Sandbox, error) { return store.Sandbox{}, c.err }
		hs.sandboxes.resume = func(string, string, sandbox.ResumeOptions) (store.Sandbox, error) { return store.Sandbox{}, c.err }
		hs.sandboxes.connect = func(string, string) (store.Sandbox, bool, error) { return store.Sandbox{}, false, c.err }
		for _, call := range [][2]string{
			{"/sandboxes", `{"templateID":"base"}`},
			{"/v2/sandboxes", `{"templateID":"base"}`},
			{"/sandboxes/sbx1/resume", `{}`},
			{"/sandboxes/sbx1/connect", `{"timeout":30}`},
		} {
			w := hs.do("POST", call[0], keyTeam1, call[1])
			got := errorCode(t, w.Body.Bytes())
			if w.Code != c.status || got != c.code {
				t.Errorf("%s: POST %s = %d error_code %q, want %d %q (%s)", c.name, call[0], w.Code, got, c.status, c.code, w.Body)
			}
			// E2B's messages of these start so, and clients may match on
			// it (e2b-dev/infra placement_errors.go).
			if c.code != "" && !strings.Contains(w.Body.String(), `"message":"Failed to place sandbox: `) {
				t.Errorf("%s: POST %s: the message does not start with E2B's prefix: %s", c.name, call[0], w.Body)
			}
		}
	}
	// A fork's results carry the code of each failed start.
	hs := newHarness(t, Config{})
	hs.sandboxes.fork = func(string, string, time.Duration, int) ([]sandbox.ForkResult, error) {
		return []sandbox.ForkResult{{Err: fmt.Errorf("%w: full", sandbox.ErrNoCapacity)}}, nil
	}
	w := hs.do("POST", "/sandboxes/sbx1/fork", keyTeam1, `{"timeout":30}`)
	var res []struct{ Error json.RawMessage }
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || len(res) != 1 || errorCode(t, res[0].Error) != CodeCapacityUnavailable {
		t.Errorf("fork result: %d %s", w.Code, w.Body)
	}
	// Elsewhere, no code: a missing sandbox's info.
	w = hs.do("GET", "/sandboxes/nope", keyTeam1, "")
	if w.Code != http.StatusNotFound || errorCode(t, w.Body.Bytes()) != "" {
		t.Errorf("info: %d %s", w.Code, w.Body)
	}
}

func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		ErrorCode *string `json:"error_code"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if e.ErrorCode == nil {
		return ""
	}
	if *e.ErrorCode == "" {
		t.Errorf("an empty error_code in %s", body)
	}
	return *e.ErrorCode
}
