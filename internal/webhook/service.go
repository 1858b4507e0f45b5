package webhook

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/warren-sandbox/warren/internal/store"
)

// Errors of the Service, for the API's statuses.
var (
	ErrInvalid  = errors.New("invalid")
	ErrNotFound = errors.New("not found")
	ErrLimit    = errors.New("limit reached")
)

// Bounds of what a team keeps.
const (
	DefaultMaxPerTeam = 20
	MaxNameLength     = 256
	MaxSecretLength   = 1024
)

// Sealer seals and opens secrets (*secret.Sealer).
type Sealer interface {
	Seal(value, context string) (string, error)
	Opener
}

// Service is the team-facing side of webhooks: it validates what the API
// takes and seals the signature secrets. Every call is scoped by team;
// an empty team matches nothing.
type Service struct {
	Store  store.Store
	Sealer Sealer
	Guard  *Guard
	// MaxPerTeam bounds a team's webhooks (default DefaultMaxPerTeam).
	MaxPerTeam int
}

// Spec is what a create or an update sets; nil fields are kept.
type Spec struct {
	Name    *string
	URL     *string
	Enabled *bool
	Events  *[]string
	Secret  *string
}

func (s *Service) checkSpec(sp Spec, create bool) error {
	if sp.Name != nil && (utf8.RuneCountInString(*sp.Name) > MaxNameLength || !utf8.ValidString(*sp.Name)) {
		return fmt.Errorf("%w: name must be valid UTF-8 of at most %d characters", ErrInvalid, MaxNameLength)
	}
	if create && sp.URL == nil {
		return fmt.Errorf("%w: url is required", ErrInvalid)
	}
	if sp.URL != nil {
		if _, err := s.Guard.CheckURL(*sp.URL); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	if create && sp.Events == nil {
		return fmt.Errorf("%w: events is required: one or more of %s", ErrInvalid, strings.Join(store.EventTypes, ", "))
	}
	if sp.Events != nil {
		if len(*sp.Events) == 0 {
			return fmt.Errorf("%w: events is empty: name one or more of %s", ErrInvalid, strings.Join(store.EventTypes, ", "))
		}
		for _, e := range *sp.Events {
			if !store.KnownEventType(e) {
				return fmt.Errorf("%w: unknown event type %q: the types are %s", ErrInvalid, e, strings.Join(store.EventTypes, ", "))
			}
		}
	}
	if create && (sp.Secret == nil || *sp.Secret == "") {
		return fmt.Errorf("%w: signatureSecret is required", ErrInvalid)
	}
	if sp.Secret != nil && (*sp.Secret == "" || len(*sp.Secret) > MaxSecretLength) {
		return fmt.Errorf("%w: signatureSecret must be 1 to %d bytes", ErrInvalid, MaxSecretLength)
	}
	return nil
}

func (s *Service) apply(w *store.Webhook, sp Spec) error {
	if sp.Name != nil {
		w.Name = *sp.Name
	}
	if sp.URL != nil {
		w.URL = *sp.URL
	}
	if sp.Enabled != nil {
		w.Enabled = *sp.Enabled
	}
	if sp.Events != nil {
		ev := slices.Clone(*sp.Events)
		slices.Sort(ev)
		w.Events = slices.Compact(ev)
	}
	if sp.Secret != nil {
		sealed, err := s.Sealer.Seal(*sp.Secret, SecretContext(w.TeamID, w.ID))
		if err != nil {
			return err
		}
		w.Secret = sealed
	}
	return nil
}

// Create adds a webhook to team (enabled unless sp says otherwise).
func (s *Service) Create(ctx context.Context, teamID string, sp Spec) (store.Webhook, error) {
	if teamID == "" {
		return store.Webhook{}, fmt.Errorf("%w: no team", ErrNotFound)
	}
	if err := s.checkSpec(sp, true); err != nil {
		return store.Webhook{}, err
	}
	now := time.Now()
	w := store.Webhook{ID: uuid.NewString(), TeamID: teamID, Enabled: true, CreatedAt: now, UpdatedAt: now}
	if err := s.apply(&w, sp); err != nil {
		return store.Webhook{}, err
	}
	max := s.MaxPerTeam
	if max <= 0 {
		max = DefaultMaxPerTeam
	}
	if err := s.Store.CreateWebhook(ctx, w, max); err != nil {
		if errors.Is(err, store.ErrLimit) {
			return store.Webhook{}, fmt.Errorf("%w: a team may have at most %d webhooks", ErrLimit, max)
		}
		return store.Webhook{}, err
	}
	return w, nil
}

// Update changes one of team's webhooks.
func (s *Service) Update(ctx context.Context, teamID, id string, sp Spec) (store.Webhook, error) {
	if err := s.checkSpec(sp, false); err != nil {
		return store.Webhook{}, err
	}
	w, err := s.Store.UpdateWebhook(ctx, teamID, id, func(w *store.Webhook) error { return s.apply(w, sp) })
	return w, notFound(id, err)
}

// RotateSecret gives one of team's webhooks a new signature secret: the
// one given, or a new random one, which is returned (this once).
func (s *Service) RotateSecret(ctx context.Context, teamID, id, secret string) (string, error) {
	if secret == "" {
		var b [32]byte
		rand.Read(b[:])
		secret = base64.RawURLEncoding.EncodeToString(b[:])
	}
	if _, err := s.Update(ctx, teamID, id, Spec{Secret: &secret}); err != nil {
		return "", err
	}
	return secret, nil
}

// Get returns one of team's webhooks.
func (s *Service) Get(ctx context.Context, teamID, id string) (store.Webhook, error) {
	w, err := s.Store.GetWebhook(ctx, teamID, id)
	return w, notFound(id, err)
}

// List lists team's webhooks.
func (s *Service) List(ctx context.Context, teamID string) ([]store.Webhook, error) {
	return s.Store.ListWebhooks(ctx, teamID)
}

// Delete deletes one of team's webhooks: it gets nothing more.
func (s *Service) Delete(ctx context.Context, teamID, id string) error {
	return notFound(id, s.Store.DeleteWebhook(ctx, teamID, id))
}

// Attempts lists one of team's webhook's latest delivery attempts.
func (s *Service) Attempts(ctx context.Context, teamID, id string, limit int) ([]store.DeliveryAttempt, error) {
	a, err := s.Store.ListWebhookAttempts(ctx, teamID, id, limit)
	return a, notFound(id, err)
}

func notFound(id string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: webhook %s", ErrNotFound, id)
	}
	return err
}
