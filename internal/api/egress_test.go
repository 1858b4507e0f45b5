package api

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/store"
)

func TestUpdateNetworkBody(t *testing.T) {
	hs := newHarness(t, Config{})
	var got sandbox.NetworkUpdate
	var gotTeam string
	hs.sandboxes.update = func(team, id string, u sandbox.NetworkUpdate) error {
		gotTeam, got = team, u
		if id == "gone" {
			return sandbox.ErrNotFound
		}
		if id == "busy" {
			return sandbox.ErrConflict
		}
		return nil
	}
	body := `{"allowOut":["198.18.0.0/15","*.example.com"],"denyOut":["0.0.0.0/0"],"allow_internet_access":true,
		"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.tok}"}}}]},
		"egressProxy":{"address":"proxy.test:3128","username":"u","password":"p"}}`
	if w := hs.do(http.MethodPut, "/sandboxes/sbx1/network", keyTeam1, body); w.Code != http.StatusNoContent {
		t.Fatalf("PUT network: %d %s", w.Code, w.Body)
	}
	if gotTeam != "t1" || len(got.AllowOut) != 2 || got.DenyOut[0] != "0.0.0.0/0" || !*got.AllowInternetAccess ||
		got.Rules["api.example.com"][0].Transform.Headers["Authorization"] != "Bearer ${e2b.secrets.tok}" ||
		got.EgressProxy.Password != "p" {
		t.Errorf("update: %+v", got)
	}
	for id, want := range map[string]int{"gone": 404, "busy": 409} {
		w := hs.do(http.MethodPut, "/sandboxes/"+id+"/network", keyTeam1, `{}`)
		if code, _ := errorBody(t, w); code != want {
			t.Errorf("%s: %d, want %d", id, code, want)
		}
	}
	if w := hs.do(http.MethodPut, "/sandboxes/sbx1/network", keyTeam1, `{"allowOut":"x"}`); w.Code != 400 {
		t.Errorf("a bad body: %d", w.Code)
	}
}

func TestGetSandboxShowsEffectiveNetwork(t *testing.T) {
	hs := newHarness(t, Config{})
	no := false
	ex := sandbox.Extra{Network: &sandbox.Network{AllowOut: []string{"*.example.com"},
		Rules:       map[string][]egress.Rule{"a.example.com": {{Transform: &egress.Transform{Headers: map[string]string{"X": "${e2b.secrets.k}"}}}}},
		EgressProxy: &sandbox.EgressProxy{Address: "p.test:1", Username: "u", PasswordSealed: "v1:sealed"}}}
	hs.sandboxes.get = func(team, id string) (store.Sandbox, error) {
		return store.Sandbox{ID: id, TeamID: team, State: store.StateRunning, AllowInternetAccess: &no, Extra: ex.String()}, nil
	}
	w := hs.do(http.MethodGet, "/sandboxes/sbx1", keyTeam1, "")
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), "sealed") || strings.Contains(w.Body.String(), "password") {
		t.Errorf("the egressProxy password shows: %s", w.Body)
	}
	var d struct {
		AllowInternetAccess *bool `json:"allowInternetAccess"`
		Network             struct {
			AllowOut    []string                     `json:"allowOut"`
			DenyOut     []string                     `json:"denyOut"`
			Rules       map[string][]json.RawMessage `json:"rules"`
			EgressProxy map[string]string            `json:"egressProxy"`
		} `json:"network"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	if *d.AllowInternetAccess || d.Network.DenyOut[0] != "0.0.0.0/0" || d.Network.AllowOut[0] != "*.example.com" ||
		len(d.Network.Rules["a.example.com"]) != 1 || d.Network.EgressProxy["address"] != "p.test:1" || d.Network.EgressProxy["username"] != "u" {
		t.Errorf("detail: %s", w.Body)
	}
}

func TestSecretsEndpoints(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sealer, err := secret.LoadSealer(dir)
	if err != nil {
		t.Fatal(err)
	}
	hs := newHarness(t, Config{Secrets: secret.New(st, sealer)})
	const canary = "canary-value-7f3a"
	w := hs.do(http.MethodPost, "/secrets", keyTeam1, `{"name":"OpenAI-Key","value":"`+canary+`","metadata":{"env":"prod"}}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	var sec struct {
		SecretID       string            `json:"secretID"`
		Name           string            `json:"name"`
		CurrentVersion int64             `json:"currentVersion"`
		Metadata       map[string]string `json:"metadata"`
	}
	json.Unmarshal(w.Body.Bytes(), &sec)
	if sec.Name != "openai-key" || sec.CurrentVersion != 1 || sec.Metadata["env"] != "prod" || !strings.HasPrefix(sec.SecretID, "sec_") {
		t.Errorf("created: %s", w.Body)
	}
	if w := hs.do(http.MethodPost, "/secrets", keyTeam1, `{"name":"openai-key","value":"x"}`); w.Code != http.StatusConflict {
		t.Errorf("same name: %d", w.Code)
	}
	if w := hs.do(http.MethodPost, "/secrets", keyTeam1, `{"name":"a/b","value":"x"}`); w.Code != http.StatusBadRequest {
		t.Errorf("bad name: %d", w.Code)
	}
	// A malformed body's error does not quote it.
	if w := hs.do(http.MethodPost, "/secrets", keyTeam1, `{"name":"x","value":`+canary+`}`); w.Code != 400 || strings.Contains(w.Body.String(), "canary") {
		t.Errorf("malformed body: %d %s", w.Code, w.Body)
	}
	if w := hs.do(http.MethodPost, "/secrets/"+sec.SecretID, keyTeam1, `{"value":"v2"}`); w.Code != 200 || !strings.Contains(w.Body.String(), `"currentVersion":2`) {
		t.Errorf("update: %d %s", w.Code, w.Body)
	}
	for _, ref := range []string{sec.SecretID, "openai-key", "OPENAI-KEY"} {
		if w := hs.do(http.MethodGet, "/secrets/"+ref, keyTeam1, ""); w.Code != 200 {
			t.Errorf("get %s: %d", ref, w.Code)
		}
		if w := hs.do(http.MethodGet, "/secrets/"+ref, keyTeam2, ""); w.Code != 404 {
			t.Errorf("another team gets %s: %d", ref, w.Code)
		}
	}
	if w := hs.do(http.MethodDelete, "/secrets/"+sec.SecretID, keyTeam2, ""); w.Code != 404 {
		t.Errorf("another team deletes: %d", w.Code)
	}
	for i := 0; i < 3; i++ {
		hs.do(http.MethodPost, "/secrets", keyTeam1, `{"name":"n`+string(rune('a'+i))+`","value":"x"}`)
	}
	var names []string
	next := ""
	for page := 0; page < 10; page++ {
		w := hs.do(http.MethodGet, "/secrets?limit=2&nextToken="+next, keyTeam1, "")
		if w.Code != 200 {
			t.Fatalf("list: %d %s", w.Code, w.Body)
		}
		if strings.Contains(w.Body.String(), canary) || strings.Contains(w.Body.String(), "v2") && strings.Contains(w.Body.String(), "value") {
			t.Errorf("a listing shows a value: %s", w.Body)
		}
		var list []struct{ Name string }
		json.Unmarshal(w.Body.Bytes(), &list)
		for _, s := range list {
			names = append(names, s.Name)
		}
		if next = w.Header().Get("X-Next-Token"); next == "" {
			break
		}
	}
	// Pages are in creation order; names made in one millisecond come in
	// ID order, so compare the set, each name once.
	slices.Sort(names)
	if strings.Join(names, ",") != "na,nb,nc,openai-key" {
		t.Errorf("listed %v", names)
	}
	if w := hs.do(http.MethodGet, "/secrets?nextToken=bad", keyTeam1, ""); w.Code != 400 {
		t.Errorf("bad token: %d", w.Code)
	}
	if w := hs.do(http.MethodDelete, "/secrets/openai-key", keyTeam1, ""); w.Code != 204 {
		t.Errorf("delete: %d", w.Code)
	}
	if w := hs.do(http.MethodGet, "/secrets/"+sec.SecretID, keyTeam1, ""); w.Code != 404 {
		t.Errorf("get after delete: %d", w.Code)
	}
	if strings.Contains(hs.log.String(), canary) {
		t.Error("the server log holds the value")
	}
}

func TestLogsV2Sources(t *testing.T) {
	hs := newHarness(t, Config{})
	t0 := time.UnixMilli(1_700_000_000_000)
	hs.sandboxes.logs = []sandbox.LogEntry{{Time: t0, Level: "info", Message: "envd started"}}
	hs.sandboxes.network = []egress.Entry{
		{Time: t0.Add(time.Second), Sandbox: "sbx1", Proto: "tls", Dst: "198.18.0.2:443", Host: "api.example.com", Decision: egress.Allow, Rule: "allowOut *.example.com"},
		{Time: t0.Add(2 * time.Second), Sandbox: "sbx1", Proto: "tcp", Dst: "198.18.0.3:22", Decision: egress.Deny, Rule: "denyOut 0.0.0.0/0"},
	}
	type out struct {
		Logs []struct {
			Level   string            `json:"level"`
			Message string            `json:"message"`
			Fields  map[string]string `json:"fields"`
		} `json:"logs"`
	}
	get := func(q string) out {
		w := hs.do(http.MethodGet, "/v2/sandboxes/sbx1/logs"+q, keyTeam1, "")
		if w.Code != 200 {
			t.Fatalf("%s: %d %s", q, w.Code, w.Body)
		}
		var o out
		json.Unmarshal(w.Body.Bytes(), &o)
		return o
	}
	if o := get(""); len(o.Logs) != 3 || o.Logs[0].Fields["source"] != "envd" || o.Logs[1].Fields["source"] != "network" || o.Logs[2].Level != "warn" {
		t.Errorf("both sources: %+v", o)
	}
	if o := get("?source=network&level=warn"); len(o.Logs) != 1 || o.Logs[0].Fields["decision"] != "deny" || o.Logs[0].Fields["dst"] != "198.18.0.3:22" {
		t.Errorf("network denials: %+v", o)
	}
	if o := get("?direction=backward&limit=1"); len(o.Logs) != 1 || o.Logs[0].Fields["decision"] != "deny" {
		t.Errorf("backward: %+v", o)
	}
	if o := get("?search=api.example.com"); len(o.Logs) != 1 || o.Logs[0].Fields["host"] != "api.example.com" {
		t.Errorf("search: %+v", o)
	}
	for _, q := range []string{"?source=x", "?limit=1001", "?level=loud", "?direction=up"} {
		if w := hs.do(http.MethodGet, "/v2/sandboxes/sbx1/logs"+q, keyTeam1, ""); w.Code != 400 {
			t.Errorf("%s: %d", q, w.Code)
		}
	}
}
