package security

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/store"
)

// apiClient has no overall timeout: builds and creates are bounded by the
// callers' contexts.
var apiClient = &http.Client{}

// apiResponse is an API answer.
type apiResponse struct {
	Status int
	Body   []byte
	Header http.Header
}

// errorBody is E2B's error shape.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (r apiResponse) decode(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("decoding %d %s: %w", r.Status, trim(r.Body), err)
	}
	return nil
}

func (r apiResponse) String() string { return fmt.Sprintf("%d %s", r.Status, trim(r.Body)) }

// call sends an API request as tm (no credentials for a zero team).
func (v *server) call(ctx context.Context, tm team, method, path string, body any) (apiResponse, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return apiResponse{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, v.apiURL+path, rd)
	if err != nil {
		return apiResponse{}, err
	}
	if tm.key != "" {
		req.Header.Set("X-API-Key", tm.key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return do(req)
}

func do(req *http.Request) (apiResponse, error) {
	res, err := apiClient.Do(req)
	if err != nil {
		return apiResponse{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	return apiResponse{Status: res.StatusCode, Body: b, Header: res.Header}, err
}

// opaque500 is the only body a 500 may have.
// A start failure's carries E2B's fixed prefix (api.placePrefix) first.
var opaque500 = regexp.MustCompile(`^(?:Failed to place sandbox: sandbox creation failed, please retry; )?internal error \(request ([^()\s]+)\)$`)

// checkErrorBody fails the test unless a non-2xx answer is E2B's
// {"code","message"} with the status as code, and a 500 says nothing but
// its request ID.
func checkErrorBody(t *testing.T, r apiResponse) {
	t.Helper()
	if r.Status < 300 {
		return
	}
	var e errorBody
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Code != r.Status || e.Message == "" {
		t.Errorf("error answer is not {\"code\":%d,\"message\":…}: %s", r.Status, r)
	}
	if r.Status != http.StatusInternalServerError {
		return
	}
	m := opaque500.FindStringSubmatch(e.Message)
	if m == nil {
		t.Errorf("a 500 body leaks the internal error (want only %q): %s", "internal error (request <id>)", r)
		return
	}
	// The detail goes to the server's log, under the request's ID.
	if !strings.Contains(S.srv.logText(), m[1]) {
		t.Errorf("the server log has no entry for request %s of a 500", m[1])
	}
}

// defaultTeam is the team of the server's first API key.
func (v *server) defaultTeam() (team, error) {
	c, err := v.credentials()
	if err != nil {
		return team{}, err
	}
	if c["E2B_API_KEY"] == "" {
		return team{}, errors.New("no E2B_API_KEY in the credentials file")
	}
	return team{id: auth.DefaultTeamID, key: c["E2B_API_KEY"]}, nil
}

// openStore opens the server's store beside it (SQLite in WAL mode).
func (v *server) openStore(ctx context.Context) (store.Store, error) {
	return store.Open(ctx, filepath.Join(v.dataDir, "warren.db"))
}

// newTeam creates a team and an API key of it through the store: `warren
// keys create` only makes keys of the default team.
func (v *server) newTeam(id string) (team, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := v.openStore(ctx)
	if err != nil {
		return team{}, err
	}
	defer st.Close()
	if err := st.CreateTeam(ctx, store.Team{ID: id, Name: id, CreatedAt: time.Now()}); err != nil {
		return team{}, err
	}
	_, key, err := auth.CreateKey(ctx, st, id, store.KindAPIKey, "security suite", "")
	if err != nil {
		return team{}, err
	}
	return team{id: id, key: key}, nil
}

// sandboxRecord reads a sandbox's record from the store.
func (v *server) sandboxRecord(id string) (store.Sandbox, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := v.openStore(ctx)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer st.Close()
	return st.GetSandbox(ctx, id)
}

// killAll kills every sandbox of tm.
func (v *server) killAll(ctx context.Context, tm team) error {
	r, err := v.call(ctx, tm, "GET", "/v2/sandboxes?limit=100&state=running,paused", nil)
	if err != nil {
		return err
	}
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := r.decode(&list); err != nil {
		return err
	}
	var errs []error
	for _, sb := range list {
		if d, err := v.call(ctx, tm, "DELETE", "/sandboxes/"+sb.SandboxID, nil); err != nil {
			errs = append(errs, err)
		} else if d.Status != http.StatusNoContent && d.Status != http.StatusNotFound {
			errs = append(errs, fmt.Errorf("killing %s: %s", sb.SandboxID, d))
		}
	}
	return errors.Join(errs...)
}

// sandbox is a sandbox the suite created.
type sandbox struct {
	ID           string
	EnvdToken    string
	TrafficToken string
	team         team
	// srv is the server it runs on (S.srv but in the runc case).
	srv *server
	// slot is its network namespace, from the store.
	slot string
}

type createOpts struct {
	Template string
	Timeout  int
	// Private: network.allowPublicTraffic false (a traffic token).
	Private    bool
	AutoPause  bool
	AutoResume bool
	// Body holds more fields of the create body (replacing the above's).
	Body map[string]any
	// Volumes mounts team volumes: path → volume name.
	Volumes map[string]string
}

// createRequest is the body of POST /sandboxes.
func (o createOpts) body() map[string]any {
	b := map[string]any{"templateID": "base", "timeout": 300}
	if o.Template != "" {
		b["templateID"] = o.Template
	}
	if o.Timeout != 0 {
		b["timeout"] = o.Timeout
	}
	if o.Private {
		b["network"] = map[string]any{"allowPublicTraffic": false}
	}
	if o.AutoPause {
		b["autoPause"] = true
	}
	if o.AutoResume {
		b["autoResume"] = map[string]any{"enabled": true}
	}
	if len(o.Volumes) > 0 {
		var mounts []map[string]string
		for p, name := range o.Volumes {
			mounts = append(mounts, map[string]string{"name": name, "path": p})
		}
		b["volumeMounts"] = mounts
	}
	for k, v := range o.Body {
		b[k] = v
	}
	return b
}

// createSandbox creates a sandbox on the suite's server.
func (s *suite) createSandbox(ctx context.Context, tm team, o createOpts) (*sandbox, error) {
	return s.srv.createSandbox(ctx, tm, o)
}

// createSandbox creates a sandbox and returns it, or an error with the
// API's answer.
func (v *server) createSandbox(ctx context.Context, tm team, o createOpts) (*sandbox, error) {
	r, err := v.call(ctx, tm, "POST", "/sandboxes", o.body())
	if err != nil {
		return nil, err
	}
	if r.Status != http.StatusCreated {
		return nil, &statusError{r}
	}
	var out struct {
		SandboxID          string  `json:"sandboxID"`
		EnvdAccessToken    *string `json:"envdAccessToken"`
		TrafficAccessToken *string `json:"trafficAccessToken"`
	}
	if err := r.decode(&out); err != nil {
		return nil, err
	}
	sb := &sandbox{ID: out.SandboxID, team: tm, srv: v}
	if out.EnvdAccessToken != nil {
		sb.EnvdToken = *out.EnvdAccessToken
	}
	if out.TrafficAccessToken != nil {
		sb.TrafficToken = *out.TrafficAccessToken
	}
	if rec, err := v.sandboxRecord(sb.ID); err == nil {
		sb.slot = rec.Slot
	}
	return sb, nil
}

// statusError is an unexpected API answer.
type statusError struct{ r apiResponse }

func (e *statusError) Error() string { return "the API answered " + e.r.String() }

// mustCreate creates a sandbox of tm or fails the test; it is killed (and
// checked for leftovers) at the end of the test.
func mustCreate(t *testing.T, tm team, o createOpts) *sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := S.createSandbox(ctx, tm, o)
	if err != nil {
		var se *statusError
		if errors.As(err, &se) {
			checkErrorBody(t, se.r)
		}
		t.Fatalf("creating a sandbox of %s: %v", o.body()["templateID"], err)
	}
	t.Cleanup(func() { killSandbox(t, sb) })
	return sb
}

// killSandbox kills sb (if still there) and checks that nothing of it is
// left on the host.
func killSandbox(t *testing.T, sb *sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := sb.srv.call(ctx, sb.team, "DELETE", "/sandboxes/"+sb.ID, nil)
	if err != nil {
		t.Errorf("killing %s: %v", sb.ID, err)
		return
	}
	if r.Status != http.StatusNoContent && r.Status != http.StatusNotFound {
		t.Errorf("killing %s: %s", sb.ID, r)
	}
	if left := sb.srv.sandboxLeftovers(sb); len(left) > 0 {
		t.Errorf("killed sandbox %s left: %s", sb.ID, strings.Join(left, "; "))
	}
}

// sandboxLeftovers lists what of a killed sandbox is still on the host.
// The store's record gives its network namespace; mounts, cgroups and
// processes carry its ID.
func (v *server) sandboxLeftovers(sb *sandbox) []string {
	var left []string
	poll.Within(15*time.Second, 200*time.Millisecond, func() bool {
		left = left[:0]
		if ms := mountsContaining(sb.ID); len(ms) > 0 {
			left = append(left, fmt.Sprintf("mounts %v", ms))
		}
		if sb.slot != "" && len(netnsWithPrefix(sb.slot)) > 0 {
			for _, n := range netnsWithPrefix(sb.slot) {
				if n == sb.slot && !v.slotReused(sb) {
					left = append(left, "network namespace "+n)
				}
			}
		}
		if cgs := cgroupsBelow(filepath.Join(v.cgroupParent, sb.ID)); len(cgs) > 0 || exists(filepath.Join("/sys/fs/cgroup", v.cgroupParent, sb.ID)) {
			left = append(left, "cgroup "+filepath.Join(v.cgroupParent, sb.ID))
		}
		if ps := processesMatching(sb.ID); len(ps) > 0 {
			left = append(left, fmt.Sprintf("processes %v", ps))
		}
		if rd := filepath.Join(v.runDir, v.runtime(), "sandboxes", sb.ID); exists(rd) {
			left = append(left, "runtime dir "+rd)
		}
		if exists(filepath.Join(v.dataDir, "sandboxes", sb.ID)) {
			left = append(left, "root filesystem dir sandboxes/"+sb.ID)
		}
		return len(left) == 0
	})
	return left
}

// slotReused tells whether another live sandbox now has sb's slot (slots
// are released and made anew, so the same name may come back).
func (v *server) slotReused(sb *sandbox) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := v.openStore(ctx)
	if err != nil {
		return false
	}
	defer st.Close()
	teams, err := st.ListTeams(ctx)
	if err != nil {
		return false
	}
	for _, tm := range teams {
		l, err := st.ListSandboxes(ctx, store.SandboxFilter{Teams: store.ForTeam(tm.ID), States: []store.SandboxState{store.StateRunning, store.StatePaused, store.StateCreating}})
		if err != nil {
			return false
		}
		for _, x := range l {
			if x.Slot == sb.slot && x.ID != sb.ID {
				return true
			}
		}
	}
	return false
}

func mountsContaining(s string) []string {
	var out []string
	for _, m := range mountsBelow("/") {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}
