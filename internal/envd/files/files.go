// Package files serves envd's plain HTTP file transfer: GET /files
// (download), POST /files (upload, multipart or raw, several files at once)
// and POST /files/compose (concatenate files).
//
// Requests are authorised by the sandbox access token in X-Access-Token or,
// for /files URLs handed to third parties, by a signature over the path,
// operation, user and token (see Signature); /files/compose takes the
// token only. They run as the user named by
// the username parameter, else the sandbox's default user: relative paths
// resolve against that user's home and written files belong to that user.
package files

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/warren-sandbox/warren/internal/envd/settings"
	"github.com/warren-sandbox/warren/internal/envd/users"
)

// Handler serves /files and /files/compose.
type Handler struct {
	settings *settings.Settings
	now      func() time.Time
}

// NewHandler returns the /files handler; mount it at "/files" and
// "/files/compose".
func NewHandler(s *settings.Settings) http.Handler {
	return &Handler{settings: s, now: time.Now}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/files/compose" && r.Method == http.MethodPost:
		h.compose(w, r)
	case r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		// HEAD is GET without the body, as everywhere in net/http.
		h.download(w, r)
	case r.URL.Path == "/files" && r.Method == http.MethodPost:
		h.upload(w, r)
	case r.URL.Path == "/files/compose":
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
	case r.URL.Path == "/files":
		w.Header().Set("Allow", "GET, HEAD, POST")
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
	default:
		writeError(w, http.StatusNotFound, "no such endpoint "+r.URL.Path)
	}
}

// authorize parses the query, checks the access token or the URL
// signature for operation ("read" or "write") and resolves the user named
// by the username parameter. It writes the error itself.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request, operation string) (*users.User, fileQuery, bool) {
	q, err := parseFileQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, q, false
	}
	if !h.authenticate(w, r, q, operation) {
		return nil, q, false
	}
	u, ok := h.user(w, q.Username)
	return u, q, ok
}

// authenticate accepts a request that carries the access token in
// X-Access-Token (a wrong header fails even with a good signature), or,
// without the header, one whose URL signature for operation is valid and
// not expired. With no token set nothing is accepted, unless envd is open
// (settings.Open): a signature keyed by an empty token is anyone's to make.
func (h *Handler) authenticate(w http.ResponseWriter, r *http.Request, q fileQuery, operation string) bool {
	if h.settings.Open() {
		return true
	}
	if got := r.Header.Get("X-Access-Token"); got != "" {
		if !h.settings.TokenMatches(got) {
			writeError(w, http.StatusUnauthorized, "invalid access token")
			return false
		}
		return true
	}
	token := h.settings.AccessToken()
	if token == "" {
		writeError(w, http.StatusUnauthorized, "envd has no access token yet")
		return false
	}
	if err := q.Verify(operation, token, h.now()); err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return false
	}
	return true
}

// authenticateToken accepts only the access token in X-Access-Token (or
// any request while envd is open). /files/compose uses it: its body names
// any number of paths and a user, which a signature over one path cannot
// bind, so a signed URL for one file must never unlock it.
func (h *Handler) authenticateToken(w http.ResponseWriter, r *http.Request) bool {
	if h.settings.Open() || h.settings.TokenMatches(r.Header.Get("X-Access-Token")) {
		return true
	}
	writeError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token")
	return false
}

// user resolves name, or the default user when name is empty. An unknown
// user is an authentication failure (401), as in infra's envd.
func (h *Handler) user(w http.ResponseWriter, name string) (*users.User, bool) {
	u, err := users.Resolve(name, h.settings.DefaultUser())
	if err != nil {
		if errors.Is(err, users.ErrUnknownUser) {
			writeError(w, http.StatusUnauthorized, err.Error())
		} else {
			writeError(w, http.StatusInternalServerError, err.Error())
		}
		return nil, false
	}
	return u, true
}

// entry is one element of an upload's response.
type entry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes envd's error body {"code","message"}.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Encoding")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}
