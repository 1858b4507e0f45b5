package dashboard

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// Sessions are kept in the store (store.DashboardSessionStore), so that
// every api process of a cluster serves a browser signed in through any
// of them. What a row holds, and what a reader of the database gains:
//
//   - The session's ID is the browser's cookie (256 random bits); the row
//     keeps only its SHA-256, which signs nobody in.
//   - The credential (API key, access token or admin token) is sealed
//     twice. Inside, AES-256-GCM under a key derived (HKDF) from the
//     session's ID, which only the browser holds, bound to the row's hash,
//     team and kind; outside, the server's Sealer (the key derived from
//     the cluster secret, which every api process has, or the node key of
//     a single box), bound to the row's hash. A reader of the database
//     alone reads neither; one who also has the cluster secret still
//     needs the cookie; one who has a cookie (and not the server's key)
//     gets what the session gives through the dashboard until it expires,
//     never the key itself.
//   - Team, mask (the credential's harmless part), admin flag and times
//     are in clear: the bounds need the team, the page shows the mask.
//
// A writer of the database can end sessions, not make one: a row must
// open under an ID its writer knows and the server's key, and an admin
// session's token is compared with the listener's on every request.

// sessionIDBytes is a session ID's length (hex in the cookie).
const sessionIDBytes = 32

// credentialKeyInfo names the key derived from a session's ID.
const credentialKeyInfo = "warren dashboard session credential v1"

// session is a live session, as one request sees it.
type session struct {
	idHash         string
	header, secret string // the credential's header and value
	team           string
	mask           string
	// admin: signed in with the admin token (admin.go).
	admin   bool
	expires time.Time
}

// envdToken is a sandbox's envd access token cached for a session.
type envdToken struct {
	token   string
	fetched time.Time
}

// maxCachedTokens bounds the envd tokens cached, all sessions together.
const maxCachedTokens = 10000

func newID() string {
	b := make([]byte, sessionIDBytes)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// validID tells a cookie that can be a session's ID (lower-case hex of
// sessionIDBytes) from anything else, which is no session.
func validID(id string) bool {
	if len(id) != 2*sessionIDBytes {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// errSealed: a row's credential does not open (another cluster secret, a
// row moved to another hash, or changed).
var errSealed = errors.New("dashboard: a session's credential does not open")

func sessionAEAD(id string) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, []byte(id), nil, credentialKeyInfo, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// boundTo is what a row's sealed credential is bound to besides its ID.
func boundTo(s *session) string {
	kind := "team"
	if s.admin {
		kind = "admin"
	}
	return s.idHash + "\x00" + s.team + "\x00" + kind
}

func sealerContext(idHash string) string { return "dashboard-session/" + idHash }

// sealCredential seals s's credential for the store, under the session's
// ID and then the server's sealer.
func (h *Handler) sealCredential(id string, s *session) (string, error) {
	aead, err := sessionAEAD(id)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	inner := aead.Seal(nonce, nonce, []byte(s.header+"\x00"+s.secret), []byte(boundTo(s)))
	return h.cfg.Sealer.Seal(base64.RawStdEncoding.EncodeToString(inner), sealerContext(s.idHash))
}

// openCredential sets s's header and secret from the row's sealed credential.
func (h *Handler) openCredential(id string, s *session, sealed string) error {
	outer, err := h.cfg.Sealer.Open(sealed, sealerContext(s.idHash))
	if err != nil {
		return errSealed
	}
	inner, err := base64.RawStdEncoding.DecodeString(outer)
	aead, aerr := sessionAEAD(id)
	if err != nil || aerr != nil || len(inner) < aead.NonceSize() {
		return errSealed
	}
	n := aead.NonceSize()
	plain, err := aead.Open(nil, inner[:n], inner[n:], []byte(boundTo(s)))
	if err != nil {
		return errSealed
	}
	header, secret, ok := strings.Cut(string(plain), "\x00")
	if !ok {
		return errSealed
	}
	s.header, s.secret = header, secret
	return nil
}

// sessionOf is the request's live session: nil with a nil error when it
// has none; an error when the store could not be asked.
//
// Two session cookies are no session: a page of a sibling host (a
// sandbox's, under the same domain) can set a second one, scoped to a
// longer path so that it comes first, to sign the user into its own
// session (cookie tossing).
func (h *Handler) sessionOf(r *http.Request) (*session, error) {
	cs := r.CookiesNamed(h.cookieName())
	if len(cs) != 1 || !validID(cs[0].Value) {
		return nil, nil
	}
	id := cs[0].Value
	row, err := h.cfg.Sessions.DashboardSession(r.Context(), hashID(id), h.cfg.Now())
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := &session{idHash: row.IDHash, team: row.TeamID, mask: row.Mask, admin: row.Admin, expires: row.ExpiresAt}
	if h.openCredential(id, s, row.Credential) != nil {
		return nil, nil
	}
	// An admin session is this listener's admin token's, checked on each
	// request: not on the API's address, not once the token has changed.
	if s.admin && !h.isAdminToken(s.secret) {
		return nil, nil
	}
	return s, nil
}

// startSession keeps s under a new ID and sets the browser's cookie.
func (h *Handler) startSession(w http.ResponseWriter, r *http.Request, s *session) {
	now := h.cfg.Now()
	id := newID()
	s.idHash, s.expires = hashID(id), now.Add(SessionTTL)
	sealed, err := h.sealCredential(id, s)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "sealing the session failed")
		return
	}
	err = h.cfg.Sessions.CreateDashboardSession(r.Context(), store.DashboardSession{IDHash: s.idHash, TeamID: s.team, Admin: s.admin,
		Mask: s.mask, Credential: sealed, CreatedAt: now, ExpiresAt: s.expires}, MaxSessionsPerTeam, MaxSessions)
	if errors.Is(err, store.ErrSessionLimit) {
		writeError(w, http.StatusServiceUnavailable, "too many dashboard sessions; retry later")
		return
	}
	if err != nil {
		storeError(w, err)
		return
	}
	http.SetCookie(w, h.cookie(r, id, int(SessionTTL/time.Second)))
	writeJSONBody(w, http.StatusOK, map[string]any{"key": s.mask, "expires": s.expires.UTC(), "admin": s.admin})
}

// endSession forgets the request's session, if it has one.
func (h *Handler) endSession(ctx context.Context, r *http.Request) error {
	cs := r.CookiesNamed(h.cookieName())
	if len(cs) != 1 || !validID(cs[0].Value) {
		return nil
	}
	return h.cfg.Sessions.DeleteDashboardSession(ctx, hashID(cs[0].Value))
}

func storeError(w http.ResponseWriter, err error) {
	if store.Unavailable(err) {
		writeError(w, http.StatusServiceUnavailable, "the store is unavailable for a moment; retry")
		return
	}
	writeError(w, http.StatusInternalServerError, "reading the dashboard's sessions failed")
}

// cachedToken is s's cached envd token of sandbox id, if fresh.
func (h *Handler) cachedToken(s *session, id string, now time.Time) (string, bool) {
	h.tokensMu.Lock()
	defer h.tokensMu.Unlock()
	t, ok := h.tokens[s.idHash+"/"+id]
	if !ok || now.Sub(t.fetched) >= envdTokenTTL {
		return "", false
	}
	return t.token, true
}

func (h *Handler) cacheToken(s *session, id, tok string, now time.Time) {
	h.tokensMu.Lock()
	defer h.tokensMu.Unlock()
	if len(h.tokens) >= maxCachedTokens { // bounded: past it, every session starts over
		clear(h.tokens)
	}
	h.tokens[s.idHash+"/"+id] = envdToken{token: tok, fetched: now}
}
