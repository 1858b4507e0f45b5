package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/warren-sandbox/warren/internal/api/gen"
	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/store"
)

// The account endpoints: GET /teams (what `e2b auth login` and `e2b auth
// configure` ask) and the team's API keys (/api-keys). E2B serves them to
// a signed-in user only, never to an API key; here that is an access
// token: an API key that could make more keys would outlive its own
// revocation.

// cliKeyName is what E2B names the key GET /teams makes.
const cliKeyName = "CLI login/configure"

// maxKeyName bounds a key's name.
const maxKeyName = 256

// accessTokenOnly answers 401 unless the request came with an access
// token, and reports whether it did.
func accessTokenOnly(w http.ResponseWriter, r *http.Request) bool {
	if credentialOf(r) != store.KindAccessToken || teamOf(r) == "" {
		writeError(w, http.StatusUnauthorized, "this endpoint takes an access token (Authorization: Bearer sk_e2b_…), not an API key")
		return false
	}
	return true
}

// failKey maps the key store's errors to statuses.
func (s *Server) failKey(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, auth.ErrTooManyKeys):
		writeError(w, http.StatusTooManyRequests, err.Error())
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "no such API key in the team")
	default:
		s.internal(w, r, err)
	}
}

func (s *Server) ListTeams(w http.ResponseWriter, r *http.Request) {
	if !accessTokenOnly(w, r) {
		return
	}
	team, err := s.cfg.Store.GetTeam(r.Context(), teamOf(r))
	if err != nil {
		s.internal(w, r, err)
		return
	}
	_, secret, err := auth.CreateKey(r.Context(), s.cfg.Store, team.ID, store.KindAPIKey, cliKeyName, "")
	if err != nil {
		s.failKey(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, []gen.Team{{TeamID: team.ID, Name: team.Name, ApiKey: secret, IsDefault: true}})
}

func maskOf(k store.Key) gen.IdentifierMaskingDetails {
	m := auth.MaskOf(k)
	return gen.IdentifierMaskingDetails{Prefix: m.Prefix, ValueLength: m.ValueLength, MaskedValuePrefix: m.First, MaskedValueSuffix: m.Last}
}

func (s *Server) ListApiKeys(w http.ResponseWriter, r *http.Request) {
	if !accessTokenOnly(w, r) {
		return
	}
	keys, err := s.cfg.Store.ListKeys(r.Context(), teamOf(r))
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out := []gen.TeamAPIKey{}
	for _, k := range keys {
		if k.Kind != store.KindAPIKey {
			continue
		}
		id, err := uuid.Parse(k.ID)
		if err != nil {
			s.internal(w, r, fmt.Errorf("key %q of team %s: its ID is not a UUID: %w", k.ID, k.TeamID, err))
			return
		}
		out = append(out, gen.TeamAPIKey{Id: id, Name: k.Name, Mask: maskOf(k), CreatedAt: k.CreatedAt.UTC()})
	}
	writeJSON(w, http.StatusOK, out)
}

// keyName reads and checks a key's name.
func keyName(w http.ResponseWriter, name string) (string, bool) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > maxKeyName || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("name must be 1 to %d bytes of text, without control characters", maxKeyName))
		return "", false
	}
	return name, true
}

func (s *Server) CreateApiKey(w http.ResponseWriter, r *http.Request) {
	if !accessTokenOnly(w, r) {
		return
	}
	var body gen.NewTeamAPIKey
	if !readJSON(w, r, &body, false) {
		return
	}
	name, ok := keyName(w, body.Name)
	if !ok {
		return
	}
	k, secret, err := auth.CreateKey(r.Context(), s.cfg.Store, teamOf(r), store.KindAPIKey, name, "")
	if err != nil {
		s.failKey(w, r, err)
		return
	}
	id, err := uuid.Parse(k.ID)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, gen.CreatedTeamAPIKey{Id: id, Key: secret, Name: k.Name, Mask: maskOf(k), CreatedAt: k.CreatedAt.UTC()})
}

// apiKeyOf is the team's API key id names, or false after a 404 (for
// another team's key, an access token's ID, or an ID that is no UUID:
// E2B answers 400 for that, which would tell nothing more).
func (s *Server) apiKeyOf(w http.ResponseWriter, r *http.Request, id string) bool {
	if _, err := uuid.Parse(id); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid API key ID %q: want a UUID", id))
		return false
	}
	keys, err := s.cfg.Store.ListKeys(r.Context(), teamOf(r))
	if err != nil {
		s.internal(w, r, err)
		return false
	}
	for _, k := range keys {
		if k.ID == id && k.Kind == store.KindAPIKey {
			return true
		}
	}
	s.failKey(w, r, store.ErrNotFound)
	return false
}

func (s *Server) UpdateApiKey(w http.ResponseWriter, r *http.Request, apiKeyID string) {
	if !accessTokenOnly(w, r) {
		return
	}
	var body gen.UpdateTeamAPIKey
	if !readJSON(w, r, &body, false) {
		return
	}
	name, ok := keyName(w, body.Name)
	if !ok || !s.apiKeyOf(w, r, apiKeyID) {
		return
	}
	if err := s.cfg.Store.RenameKey(r.Context(), teamOf(r), apiKeyID, name); err != nil {
		s.failKey(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) DeleteApiKey(w http.ResponseWriter, r *http.Request, apiKeyID string) {
	if !accessTokenOnly(w, r) || !s.apiKeyOf(w, r, apiKeyID) {
		return
	}
	if err := s.cfg.Store.DeleteKey(r.Context(), teamOf(r), apiKeyID); err != nil {
		s.failKey(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
