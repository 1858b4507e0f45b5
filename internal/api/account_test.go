package api

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/store"
)

// accountHarness is the API on a real (SQLite) store with two teams,
// each with an API key and an access token.
func accountHarness(t *testing.T) (hs *harness, creds map[string][2]string) {
	ctx := context.Background()
	s, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	creds = map[string][2]string{}
	for _, team := range []string{"t1", "t2"} {
		if err := s.CreateTeam(ctx, store.Team{ID: team, Name: "team " + team, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		_, key, err := auth.CreateKey(ctx, s, team, store.KindAPIKey, "k", "")
		if err != nil {
			t.Fatal(err)
		}
		_, tok, err := auth.CreateKey(ctx, s, team, store.KindAccessToken, "t", "")
		if err != nil {
			t.Fatal(err)
		}
		creds[team] = [2]string{key, tok}
	}
	return newHarness(t, Config{Store: s}), creds
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

func TestTeamsAndAPIKeys(t *testing.T) {
	hs, creds := accountHarness(t)
	key1, tok1, tok2 := creds["t1"][0], creds["t1"][1], creds["t2"][1]

	// API keys are refused on every account endpoint.
	for _, c := range [][3]string{{"GET", "/teams", ""}, {"GET", "/api-keys", ""}, {"POST", "/api-keys", `{"name":"x"}`},
		{"PATCH", "/api-keys/" + uuid.NewString(), `{"name":"x"}`}, {"DELETE", "/api-keys/" + uuid.NewString(), ""}} {
		if w := hs.do(c[0], c[1], key1, c[2]); w.Code != http.StatusUnauthorized {
			t.Errorf("%s %s with an API key: %d %s", c[0], c[1], w.Code, w.Body)
		}
	}

	// GET /teams: the token's team, with a new key that works.
	w := hs.do("GET", "/teams", "", "", bearer(tok1)...)
	var teams []map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &teams); err != nil || w.Code != 200 || len(teams) != 1 {
		t.Fatalf("GET /teams: %d %s", w.Code, w.Body)
	}
	if teams[0]["teamID"] != "t1" || teams[0]["name"] != "team t1" || teams[0]["isDefault"] != true {
		t.Errorf("team %v", teams[0])
	}
	cliKey, _ := teams[0]["apiKey"].(string)
	if w := hs.do("GET", "/sandboxes/nope", cliKey, ""); w.Code != http.StatusNotFound {
		t.Errorf("the key GET /teams made does not authenticate: %d %s", w.Code, w.Body)
	}

	// Create: the key once, then only its mask.
	w = hs.do("POST", "/api-keys", "", `{"name":"ci"}`, bearer(tok1)...)
	var created struct {
		ID, Key, Name string
		Mask          struct {
			Prefix            string
			ValueLength       int
			MaskedValuePrefix string
			MaskedValueSuffix string
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &created); err != nil || w.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	if _, err := uuid.Parse(created.ID); err != nil || created.Name != "ci" || !strings.HasPrefix(created.Key, "e2b_") {
		t.Errorf("created %+v", created)
	}
	rest := strings.TrimPrefix(created.Key, "e2b_")
	if m := created.Mask; m.Prefix != "e2b_" || m.ValueLength != len(rest) || m.MaskedValuePrefix != rest[:2] || m.MaskedValueSuffix != rest[len(rest)-4:] {
		t.Errorf("mask %+v of %s", m, created.Key)
	}
	w = hs.do("GET", "/api-keys", "", "", bearer(tok1)...)
	if strings.Contains(w.Body.String(), created.Key) || strings.Contains(w.Body.String(), rest[2:36]) || !strings.Contains(w.Body.String(), created.ID) {
		t.Errorf("listing shows the key, or lacks it: %s", w.Body)
	}
	if strings.Contains(w.Body.String(), "sk_e2b_") {
		t.Errorf("listing shows access tokens: %s", w.Body)
	}

	// Another team sees, renames and deletes nothing of t1's.
	if w := hs.do("GET", "/api-keys", "", "", bearer(tok2)...); strings.Contains(w.Body.String(), created.ID) {
		t.Errorf("t2 lists t1's key: %s", w.Body)
	}
	if w := hs.do("PATCH", "/api-keys/"+created.ID, "", `{"name":"mine"}`, bearer(tok2)...); w.Code != http.StatusNotFound {
		t.Errorf("t2 renames t1's key: %d %s", w.Code, w.Body)
	}
	if w := hs.do("DELETE", "/api-keys/"+created.ID, "", "", bearer(tok2)...); w.Code != http.StatusNotFound {
		t.Errorf("t2 deletes t1's key: %d %s", w.Code, w.Body)
	}
	if w := hs.do("GET", "/sandboxes/nope", created.Key, ""); w.Code != http.StatusNotFound {
		t.Errorf("the key stopped working after t2's attempts: %d", w.Code)
	}
	// Bad input.
	for _, c := range [][3]string{{"PATCH", "/api-keys/not-a-uuid", `{"name":"x"}`}, {"POST", "/api-keys", `{"name":""}`},
		{"POST", "/api-keys", `{"name":"a\nb"}`}, {"PATCH", "/api-keys/" + created.ID, `{}`}} {
		if w := hs.do(c[0], c[1], "", c[2], bearer(tok1)...); w.Code != http.StatusBadRequest {
			t.Errorf("%s %s %s: %d %s", c[0], c[1], c[2], w.Code, w.Body)
		}
	}

	// Rename, then delete: the key fails at once.
	if w := hs.do("PATCH", "/api-keys/"+created.ID, "", `{"name":"renamed"}`, bearer(tok1)...); w.Code != http.StatusOK {
		t.Errorf("rename: %d %s", w.Code, w.Body)
	}
	if w := hs.do("GET", "/api-keys", "", "", bearer(tok1)...); !strings.Contains(w.Body.String(), `"renamed"`) {
		t.Errorf("after rename: %s", w.Body)
	}
	if w := hs.do("DELETE", "/api-keys/"+created.ID, "", "", bearer(tok1)...); w.Code != http.StatusNoContent {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := hs.do("GET", "/sandboxes/nope", created.Key, ""); w.Code != http.StatusUnauthorized {
		t.Errorf("a deleted key still authenticates: %d", w.Code)
	}
	if w := hs.do("DELETE", "/api-keys/"+created.ID, "", "", bearer(tok1)...); w.Code != http.StatusNotFound {
		t.Errorf("second delete: %d %s", w.Code, w.Body)
	}
}
