package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/webhook"
)

// eventsHarness is the API on a real store with two teams (API keys
// t1, t2), webhooks sealed with a real node key, and the events of a
// sandbox of t1 that was created, paused, resumed and killed.
func eventsHarness(t *testing.T) (*harness, store.Store, map[string]string) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	keys := map[string]string{}
	for _, team := range []string{"t1", "t2"} {
		if err := st.CreateTeam(ctx, store.Team{ID: team, Name: team, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		_, key, err := auth.CreateKey(ctx, st, team, store.KindAPIKey, "k", "")
		if err != nil {
			t.Fatal(err)
		}
		keys[team] = key
	}
	sealer, err := secret.LoadSealer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "sb1", TeamID: "t1", TemplateID: "base", State: store.StateCreating}); err != nil {
		t.Fatal(err)
	}
	for _, stt := range []store.SandboxState{store.StateRunning, store.StatePaused, store.StateRunning, store.StateKilled} {
		if _, err := st.UpdateSandbox(ctx, "sb1", func(s *store.Sandbox) error { s.State = stt; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	svc := &webhook.Service{Store: st, Sealer: sealer, Guard: &webhook.Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, MaxPerTeam: 3}
	return newHarness(t, Config{Store: st, Webhooks: svc}), st, keys
}

func decodeEvents(t *testing.T, w interface{ Result() *http.Response }, body []byte) []string {
	t.Helper()
	var evs []struct{ Type, SandboxID string }
	if err := json.Unmarshal(body, &evs); err != nil {
		t.Fatalf("events: %v %s", err, body)
	}
	var out []string
	for _, e := range evs {
		out = append(out, strings.TrimPrefix(e.Type, "sandbox.lifecycle."))
	}
	return out
}

func TestEventsPolling(t *testing.T) {
	hs, _, keys := eventsHarness(t)
	for path, want := range map[string]string{
		"/events/sandboxes":                                    "killed,resumed,paused,created",
		"/events/sandboxes?orderAsc=true":                      "created,paused,resumed,killed",
		"/events/sandboxes/sb1?orderAsc=true&offset=1&limit=2": "paused,resumed",
		"/events/sandboxes?types=sandbox.lifecycle.killed&types=sandbox.lifecycle.created": "killed,created",
		"/events/sandboxes?limit=1": "killed",
	} {
		w := hs.do("GET", path, keys["t1"], "")
		if w.Code != 200 {
			t.Errorf("%s: %d %s", path, w.Code, w.Body)
			continue
		}
		if got := strings.Join(decodeEvents(t, w, w.Body.Bytes()), ","); got != want {
			t.Errorf("%s = %s, want %s", path, got, want)
		}
	}
	// Another team sees none; the sandbox is not its.
	if w := hs.do("GET", "/events/sandboxes", keys["t2"], ""); w.Code != 200 || strings.TrimSpace(w.Body.String()) != "[]" {
		t.Errorf("t2 lists: %d %s", w.Code, w.Body)
	}
	for _, c := range []struct{ path, key string }{{"/events/sandboxes/sb1", keys["t2"]}, {"/events/sandboxes/nope", keys["t1"]}} {
		if w := hs.do("GET", c.path, c.key, ""); w.Code != 404 || !strings.Contains(w.Body.String(), `"code":404`) {
			t.Errorf("%s: %d %s", c.path, w.Code, w.Body)
		}
	}
	for _, q := range []string{"limit=0", "limit=101", "limit=x", "offset=-1", "orderAsc=maybe", "types=sandbox.lifecycle.exploded"} {
		if w := hs.do("GET", "/events/sandboxes?"+q, keys["t1"], ""); w.Code != 400 || !strings.Contains(w.Body.String(), `"code":400`) {
			t.Errorf("%s: %d %s", q, w.Code, w.Body)
		}
	}
	if w := hs.do("GET", "/events/sandboxes", "", ""); w.Code != 401 {
		t.Errorf("no key: %d", w.Code)
	}
}

func TestWebhookCRUD(t *testing.T) {
	hs, st, keys := eventsHarness(t)
	create := `{"name":"hook","url":"http://127.0.0.1:9/hook","enabled":true,"events":["sandbox.lifecycle.created","sandbox.lifecycle.killed"],"signatureSecret":"topsecret-value"}`
	w := hs.do("POST", "/events/webhooks", keys["t1"], create)
	if w.Code != 201 || strings.Contains(w.Body.String(), "topsecret") {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	var h struct {
		ID, TeamID, Name, URL string
		Enabled               bool
		Events                []string
	}
	json.Unmarshal(w.Body.Bytes(), &h)
	if h.ID == "" || h.TeamID != "t1" || h.Name != "hook" || !h.Enabled || len(h.Events) != 2 {
		t.Errorf("created %+v", h)
	}
	// Sealed at rest.
	raw, err := st.GetWebhook(context.Background(), "t1", h.ID)
	if err != nil || raw.Secret == "" || strings.Contains(raw.Secret, "topsecret") {
		t.Errorf("stored secret %q %v", raw.Secret, err)
	}
	for _, c := range [][3]string{
		{"GET", "/events/webhooks/" + h.ID, ""},
		{"PATCH", "/events/webhooks/" + h.ID, `{"enabled":false,"name":"renamed"}`},
		{"GET", "/events/webhooks", ""},
	} {
		w := hs.do(c[0], c[1], keys["t1"], c[2])
		if w.Code != 200 || strings.Contains(w.Body.String(), "topsecret") || strings.Contains(w.Body.String(), "ignatureSecret") {
			t.Errorf("%s %s: %d %s", c[0], c[1], w.Code, w.Body)
		}
	}
	if got, _ := st.GetWebhook(context.Background(), "t1", h.ID); got.Enabled || got.Name != "renamed" || len(got.Events) != 2 {
		t.Errorf("after PATCH: %+v", got)
	}
	// Another team's webhook: 404 on every route.
	for _, c := range [][3]string{
		{"GET", "/events/webhooks/" + h.ID, ""}, {"PATCH", "/events/webhooks/" + h.ID, `{"name":"x"}`},
		{"DELETE", "/events/webhooks/" + h.ID, ""}, {"GET", "/events/webhooks/" + h.ID + "/deliveries", ""},
		{"POST", "/events/webhooks/" + h.ID + "/secret", ""},
	} {
		if w := hs.do(c[0], c[1], keys["t2"], c[2]); w.Code != 404 || !strings.Contains(w.Body.String(), `"code":404`) {
			t.Errorf("t2 %s %s: %d %s", c[0], c[1], w.Code, w.Body)
		}
	}
	if w := hs.do("GET", "/events/webhooks", keys["t2"], ""); strings.TrimSpace(w.Body.String()) != "[]" {
		t.Errorf("t2 lists %s", w.Body)
	}
	// Rotation: a given secret, or a new one answered once.
	if w := hs.do("POST", "/events/webhooks/"+h.ID+"/secret", keys["t1"], `{"signatureSecret":"next-secret"}`); w.Code != 200 || strings.Contains(w.Body.String(), "next-secret") {
		t.Errorf("rotate given: %d %s", w.Code, w.Body)
	}
	w = hs.do("POST", "/events/webhooks/"+h.ID+"/secret", keys["t1"], "")
	var rot struct{ SignatureSecret string }
	json.Unmarshal(w.Body.Bytes(), &rot)
	if w.Code != 200 || len(rot.SignatureSecret) < 32 {
		t.Errorf("rotate random: %d %s", w.Code, w.Body)
	}
	if w := hs.do("GET", "/events/webhooks/"+h.ID+"/deliveries", keys["t1"], ""); w.Code != 200 || strings.TrimSpace(w.Body.String()) != "[]" {
		t.Errorf("deliveries: %d %s", w.Code, w.Body)
	}
	if w := hs.do("DELETE", "/events/webhooks/"+h.ID, keys["t1"], ""); w.Code != 204 {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := hs.do("GET", "/events/webhooks/"+h.ID, keys["t1"], ""); w.Code != 404 {
		t.Errorf("after delete: %d", w.Code)
	}
}

func TestWebhookBadInput(t *testing.T) {
	hs, _, keys := eventsHarness(t)
	ok := func(field, value string) string {
		m := map[string]any{"name": "h", "url": "http://127.0.0.1:9/", "enabled": true,
			"events": []string{"sandbox.lifecycle.created"}, "signatureSecret": "s"}
		if value == "<omit>" {
			delete(m, field)
		} else {
			var v any
			json.Unmarshal([]byte(value), &v)
			m[field] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	for _, c := range []struct{ field, value, says string }{
		{"url", `"http://169.254.169.254/latest/meta-data/"`, "internal"},
		{"url", `"http://10.1.2.3/"`, "internal"},
		{"url", `"ftp://example.com/"`, "scheme"},
		{"url", `"not a url"`, "scheme"},
		{"url", `"<omit>"`, "url is required"},
		{"events", `[]`, "events is empty"},
		{"events", `["sandbox.lifecycle.exploded"]`, "unknown event type"},
		{"events", `"<omit>"`, "events is required"},
		{"signatureSecret", `""`, "signatureSecret"},
		{"signatureSecret", `"<omit>"`, "signatureSecret is required"},
	} {
		value := c.value
		if value == `"<omit>"` {
			value = "<omit>"
		}
		w := hs.do("POST", "/events/webhooks", keys["t1"], ok(c.field, value))
		if w.Code != 400 || !strings.Contains(w.Body.String(), c.says) || !strings.Contains(w.Body.String(), `"code":400`) {
			t.Errorf("%s=%s: %d %s", c.field, c.value, w.Code, w.Body)
		}
	}
	if w := hs.do("POST", "/events/webhooks", keys["t1"], `{"signatureSecret": "leak-me"`); w.Code != 400 || strings.Contains(w.Body.String(), "leak-me") {
		t.Errorf("bad JSON: %d %s", w.Code, w.Body)
	}
	// The team's bound (3 here).
	for i := range 4 {
		w := hs.do("POST", "/events/webhooks", keys["t1"], ok("name", `"h"`))
		if want := map[bool]int{true: 201, false: 429}[i < 3]; w.Code != want {
			t.Errorf("webhook %d: %d %s", i+1, w.Code, w.Body)
		}
	}
	if w := hs.do("PATCH", "/events/webhooks/nope", keys["t1"], `{"events":[]}`); w.Code != 400 {
		t.Errorf("PATCH empty events: %d %s", w.Code, w.Body)
	}
}
