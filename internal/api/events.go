package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/webhook"
)

// Webhooks is what the API needs of the team webhooks (*webhook.Service).
type Webhooks interface {
	Create(ctx context.Context, teamID string, sp webhook.Spec) (store.Webhook, error)
	Update(ctx context.Context, teamID, id string, sp webhook.Spec) (store.Webhook, error)
	RotateSecret(ctx context.Context, teamID, id, secret string) (string, error)
	Get(ctx context.Context, teamID, id string) (store.Webhook, error)
	List(ctx context.Context, teamID string) ([]store.Webhook, error)
	Delete(ctx context.Context, teamID, id string) error
	Attempts(ctx context.Context, teamID, id string, limit int) ([]store.DeliveryAttempt, error)
}

var _ Webhooks = (*webhook.Service)(nil)

// Bounds of the events API's pages (E2B's).
const (
	defaultEventLimit = 10
	maxEventLimit     = 100
	// maxEventOffset keeps a page's query cheap.
	maxEventOffset = 100_000
	// maxAttempts is the most delivery attempts a listing returns.
	maxAttempts = 100
)

// routeEvents adds the lifecycle events and webhook routes (E2B's
// /events/..., not in the generated router) to mux.
func (s *Server) routeEvents(mux *http.ServeMux) {
	mux.HandleFunc("GET /events/sandboxes", s.listTeamEvents)
	mux.HandleFunc("GET /events/sandboxes/{sandboxID}", s.listSandboxEvents)
	mux.HandleFunc("POST /events/webhooks", s.createWebhook)
	mux.HandleFunc("GET /events/webhooks", s.listWebhooks)
	mux.HandleFunc("GET /events/webhooks/{webhookID}", s.getWebhook)
	mux.HandleFunc("PATCH /events/webhooks/{webhookID}", s.updateWebhook)
	mux.HandleFunc("DELETE /events/webhooks/{webhookID}", s.deleteWebhook)
	// Warren's: recent delivery attempts, and a new signature secret.
	mux.HandleFunc("GET /events/webhooks/{webhookID}/deliveries", s.listDeliveries)
	mux.HandleFunc("POST /events/webhooks/{webhookID}/secret", s.rotateWebhookSecret)
}

// eventFilter reads the polling query: offset (≥ 0), limit (1–100,
// default 10), orderAsc (default false), types (repeatable, or
// comma-separated).
func eventFilter(r *http.Request) (store.EventFilter, error) {
	q := r.URL.Query()
	f := store.EventFilter{TeamID: teamOf(r), Limit: defaultEventLimit}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxEventOffset {
			return f, fmt.Errorf("offset must be an integer from 0 to %d", maxEventOffset)
		}
		f.Offset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventLimit {
			return f, fmt.Errorf("limit must be an integer from 1 to %d", maxEventLimit)
		}
		f.Limit = n
	}
	if v := q.Get("orderAsc"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return f, errors.New("orderAsc must be true or false")
		}
		f.Asc = b
	}
	for _, v := range q["types"] {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t == "" {
				continue
			}
			if !store.KnownEventType(t) {
				return f, fmt.Errorf("unknown event type %q: the types are %s", t, strings.Join(store.EventTypes, ", "))
			}
			f.Types = append(f.Types, t)
		}
	}
	if len(f.Types) > len(store.EventTypes)*2 {
		return f, errors.New("too many types")
	}
	return f, nil
}

func (s *Server) listTeamEvents(w http.ResponseWriter, r *http.Request) {
	f, err := eventFilter(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.writeEvents(w, r, f)
}

func (s *Server) listSandboxEvents(w http.ResponseWriter, r *http.Request) {
	f, err := eventFilter(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	f.SandboxID = r.PathValue("sandboxID")
	// A sandbox the team has no event of, and no record of, is unknown
	// (another team's included).
	found, err := s.cfg.Store.ListSandboxEvents(r.Context(), store.EventFilter{TeamID: f.TeamID, SandboxID: f.SandboxID, Limit: 1})
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if len(found) == 0 {
		sb, err := s.cfg.Store.GetSandbox(r.Context(), f.SandboxID)
		if err != nil || sb.TeamID != f.TeamID || f.TeamID == "" {
			writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", f.SandboxID))
			return
		}
	}
	s.writeEvents(w, r, f)
}

// writeEvents answers the events' JSON array, each as stored.
func (s *Server) writeEvents(w http.ResponseWriter, r *http.Request, f store.EventFilter) {
	evs, err := s.cfg.Store.ListSandboxEvents(r.Context(), f)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, e := range evs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e.Body)
	}
	b.WriteString("]\n")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b.Bytes())
}

// webhookJSON is E2B's webhook object: never the secret.
type webhookJSON struct {
	ID        string    `json:"id"`
	TeamID    string    `json:"teamId"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	Enabled   bool      `json:"enabled"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
}

func toWebhookJSON(h store.Webhook) webhookJSON {
	ev := h.Events
	if ev == nil {
		ev = []string{}
	}
	return webhookJSON{ID: h.ID, TeamID: h.TeamID, Name: h.Name, CreatedAt: h.CreatedAt.UTC(), UpdatedAt: h.UpdatedAt.UTC(),
		Enabled: h.Enabled, URL: h.URL, Events: ev}
}

// webhookBody is a create's or an update's body.
type webhookBody struct {
	Name            *string   `json:"name"`
	URL             *string   `json:"url"`
	Enabled         *bool     `json:"enabled"`
	Events          *[]string `json:"events"`
	SignatureSecret *string   `json:"signatureSecret"`
}

func (b webhookBody) spec() webhook.Spec {
	return webhook.Spec{Name: b.Name, URL: b.URL, Enabled: b.Enabled, Events: b.Events, Secret: b.SignatureSecret}
}

func (s *Server) webhooks(w http.ResponseWriter) bool {
	if s.cfg.Webhooks == nil {
		writeError(w, http.StatusNotImplemented, "this server delivers no webhooks")
		return false
	}
	return true
}

// failWebhook maps the webhook service's errors.
func (s *Server) failWebhook(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, webhook.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, webhook.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, webhook.ErrLimit):
		writeError(w, http.StatusTooManyRequests, err.Error())
	default:
		s.internal(w, r, err)
	}
}

func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request) {
	if !s.webhooks(w) {
		return
	}
	var body webhookBody
	if !readSecretJSON(w, r, &body) {
		return
	}
	h, err := s.cfg.Webhooks.Create(r.Context(), teamOf(r), body.spec())
	if err != nil {
		s.failWebhook(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toWebhookJSON(h))
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	if !s.webhooks(w) {
		return
	}
	hs, err := s.cfg.Webhooks.List(r.Context(), teamOf(r))
	if err != nil {
		s.failWebhook(w, r, err)
		return
	}
	out := make([]webhookJSON, 0, len(hs))
	for _, h := range hs {
		out = append(out, toWebhookJSON(h))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request) {
	if !s.webhooks(w) {
		return
	}
	h, err := s.cfg.Webhooks.Get(r.Context(), teamOf(r), r.PathValue("webhookID"))
	if err != nil {
		s.failWebhook(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(h))
}

func (s *Server) updateWebhook(w http.ResponseWriter, r *http.Request) {
	if !s.webhooks(w) {
		return
	}
	var body webhookBody
	if !readSecretJSON(w, r, &body) {
		return
	}
	h, err := s.cfg.Webhooks.Update(r.Context(), teamOf(r), r.PathValue("webhookID"), body.spec())
	if err != nil {
		s.failWebhook(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(h))
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	if !s.webhooks(w) {
		return
	}
	if err := s.cfg.Webhooks.Delete(r.Context(), teamOf(r), r.PathValue("webhookID")); err != nil {
		s.failWebhook(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// rotateWebhookSecret sets a webhook's signature secret: the body's
// signatureSecret, or a new random one, answered this once.
func (s *Server) rotateWebhookSecret(w http.ResponseWriter, r *http.Request) {
	if !s.webhooks(w) {
		return
	}
	var body struct {
		SignatureSecret *string `json:"signatureSecret"`
	}
	status, err := decode(r.Body, &body, true)
	if err != nil {
		msg := "invalid JSON body"
		if status == http.StatusRequestEntityTooLarge {
			msg = err.Error()
		}
		writeError(w, status, msg)
		return
	}
	given := ""
	if body.SignatureSecret != nil {
		if *body.SignatureSecret == "" {
			writeError(w, http.StatusBadRequest, "signatureSecret is empty: omit it for a new random one")
			return
		}
		given = *body.SignatureSecret
	}
	secret, err := s.cfg.Webhooks.RotateSecret(r.Context(), teamOf(r), r.PathValue("webhookID"), given)
	if err != nil {
		s.failWebhook(w, r, err)
		return
	}
	out := map[string]string{}
	if given == "" {
		out["signatureSecret"] = secret // made here: the caller's only copy
	}
	writeJSON(w, http.StatusOK, out)
}

// attemptJSON is one delivery attempt (Warren's).
type attemptJSON struct {
	DeliveryID string    `json:"deliveryId"`
	EventID    string    `json:"eventId"`
	EventType  string    `json:"eventType"`
	Attempt    int       `json:"attempt"`
	Status     int       `json:"status"`
	DurationMS int64     `json:"durationMs"`
	Error      string    `json:"error,omitempty"`
	Timestamp  time.Time `json:"timestamp"`
}

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) {
	if !s.webhooks(w) {
		return
	}
	limit := 20
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxAttempts {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be an integer from 1 to %d", maxAttempts))
			return
		}
		limit = n
	}
	as, err := s.cfg.Webhooks.Attempts(r.Context(), teamOf(r), r.PathValue("webhookID"), limit)
	if err != nil {
		s.failWebhook(w, r, err)
		return
	}
	out := make([]attemptJSON, 0, len(as))
	for _, a := range as {
		out = append(out, attemptJSON{DeliveryID: a.ID, EventID: a.EventID, EventType: a.EventType, Attempt: a.Attempt,
			Status: a.Status, DurationMS: a.Duration.Milliseconds(), Error: a.Error, Timestamp: a.CreatedAt.UTC()})
	}
	writeJSON(w, http.StatusOK, out)
}
