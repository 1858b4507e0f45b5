package store

import (
	"context"
	"time"
)

// Sandbox lifecycle event types (E2B's names).
const (
	EventCreated      = "sandbox.lifecycle.created"
	EventKilled       = "sandbox.lifecycle.killed"
	EventPaused       = "sandbox.lifecycle.paused"
	EventResumed      = "sandbox.lifecycle.resumed"
	EventUpdated      = "sandbox.lifecycle.updated"
	EventCheckpointed = "sandbox.lifecycle.checkpointed"
)

// EventTypes are every event type, in E2B's order.
var EventTypes = []string{EventCreated, EventKilled, EventUpdated, EventPaused, EventResumed, EventCheckpointed}

// KnownEventType reports whether t is one of EventTypes.
func KnownEventType(t string) bool {
	for _, k := range EventTypes {
		if k == t {
			return true
		}
	}
	return false
}

// SandboxEvent is a lifecycle event of a sandbox: written by the store
// in the transaction of the change that causes it (an outbox), served by
// the events API and delivered to the team's webhooks.
type SandboxEvent struct {
	ID        string
	TeamID    string
	SandboxID string
	// Seq orders one sandbox's events (1, 2, …).
	Seq       int64
	Type      string
	CreatedAt time.Time
	// Body is the event's JSON, as served and delivered.
	Body []byte
}

// EventFilter selects events for ListSandboxEvents.
type EventFilter struct {
	// TeamID is required: an empty one matches nothing.
	TeamID string
	// SandboxID, if set, keeps only that sandbox's events.
	SandboxID string
	// Types, if set, keeps only events of one of them.
	Types []string
	// Offset skips that many; Limit bounds the result (0: no bound).
	Offset, Limit int
	// Asc orders oldest first (default newest first).
	Asc bool
}

// Webhook is a team's webhook. Secret is the signature secret sealed
// (internal/secret): the store never holds it in clear.
type Webhook struct {
	ID        string
	TeamID    string
	Name      string
	URL       string
	Enabled   bool
	Events    []string
	Secret    string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Subscribes reports whether the webhook takes events of type t.
func (w *Webhook) Subscribes(t string) bool {
	for _, e := range w.Events {
		if e == t {
			return true
		}
	}
	return false
}

// Delivery states.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// Delivery is an event a webhook is to receive.
type Delivery struct {
	WebhookID string
	Event     SandboxEvent
	State     string
	// Attempts made so far.
	Attempts int
	// NextAt is when a pending delivery may be tried.
	NextAt time.Time
}

// DueWebhook is a webhook with a delivery to make, and its team.
type DueWebhook struct {
	ID, TeamID string
}

// DeliveryAttempt is one attempt at a delivery: the HTTP status (0 when
// there was no answer), how long it took and why it failed ("" if not).
type DeliveryAttempt struct {
	ID        string
	WebhookID string
	EventID   string
	EventType string
	Attempt   int
	Status    int
	Duration  time.Duration
	Error     string
	CreatedAt time.Time
}

// DeliveryOutcome is what RecordAttempt makes of a delivery.
type DeliveryOutcome struct {
	// State is the delivery's new state; a pending one is tried again at
	// NextAt.
	State  string
	NextAt time.Time
}

// EventStore keeps lifecycle events and webhooks. Every team-facing
// method is scoped by team and fails closed: an empty team matches
// nothing (ErrNotFound, or no rows).
type EventStore interface {
	// ListSandboxEvents lists a team's events, newest first unless Asc.
	ListSandboxEvents(ctx context.Context, f EventFilter) ([]SandboxEvent, error)

	// CreateWebhook adds a webhook to its team, unless the team has
	// maxPerTeam already (ErrLimit; 0: no bound).
	CreateWebhook(ctx context.Context, w Webhook, maxPerTeam int) error
	GetWebhook(ctx context.Context, teamID, id string) (Webhook, error)
	// ListWebhooks lists a team's webhooks, oldest first.
	ListWebhooks(ctx context.Context, teamID string) ([]Webhook, error)
	// UpdateWebhook reads one of team's webhooks, lets update change it
	// and writes it back atomically; an error from update aborts.
	UpdateWebhook(ctx context.Context, teamID, id string, update func(*Webhook) error) (Webhook, error)
	// DeleteWebhook deletes one of team's webhooks with its deliveries
	// still to make: it gets nothing more.
	DeleteWebhook(ctx context.Context, teamID, id string) error
	// ListWebhookAttempts lists one of team's webhook's latest delivery
	// attempts, newest first, at most limit.
	ListWebhookAttempts(ctx context.Context, teamID, webhookID string, limit int) ([]DeliveryAttempt, error)

	// DueWebhooks lists the webhooks with a pending delivery due at now
	// whose lease is free, expired or owner's: at most limit.
	DueWebhooks(ctx context.Context, owner string, now time.Time, limit int) ([]DueWebhook, error)
	// LeaseWebhook takes (or renews) the delivery lease of a webhook for
	// owner until until, if it is free, expired at now or owner's
	// already; it reports whether owner holds it.
	LeaseWebhook(ctx context.Context, id, owner string, now, until time.Time) (bool, error)
	// ReleaseWebhook gives owner's lease of a webhook back.
	ReleaseWebhook(ctx context.Context, id, owner string) error
	// NextDelivery is a webhook's first pending delivery (in the order
	// its events were made), with the webhook; ok is false when there is
	// none, or the webhook is gone.
	NextDelivery(ctx context.Context, webhookID string) (d Delivery, w Webhook, ok bool, err error)
	// RecordAttempt records an attempt at a delivery and its outcome, if
	// owner still holds the webhook's lease (else ErrConflict: another
	// process delivers it now).
	RecordAttempt(ctx context.Context, owner string, a DeliveryAttempt, out DeliveryOutcome) error
	// DropDeliveries fails a webhook's pending deliveries beyond its
	// first keep (the oldest are kept): a dead endpoint's queue is
	// bounded. It returns how many it dropped.
	DropDeliveries(ctx context.Context, webhookID string, keep int) (int, error)
	// PendingDeliveries counts the deliveries still to make (all webhooks).
	PendingDeliveries(ctx context.Context) (int, error)
	// PruneEvents deletes events, finished deliveries and attempts made
	// before before; it returns how many events it deleted.
	PruneEvents(ctx context.Context, before time.Time) (int, error)
}
