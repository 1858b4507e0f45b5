package webhook

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/warren-sandbox/warren/internal/store"
)

// Defaults of DispatcherConfig.
const (
	DefaultRetries        = 3
	DefaultRetryInterval  = 10 * time.Second
	DefaultAttemptTimeout = 10 * time.Second
	DefaultPollInterval   = 50 * time.Millisecond
	DefaultLeaseTTL       = 45 * time.Second
	DefaultMaxWorkers     = 256
	DefaultMaxTeamWorkers = 8
	DefaultMaxQueue       = 1000
	DefaultRetention      = 7 * 24 * time.Hour
)

// Observer is told of each attempt's outcome ("delivered", "retry",
// "failed", "dropped") and its latency from the event, and of the
// deliveries still to make (*metrics.Metrics).
type Observer interface {
	WebhookAttempt(outcome string, sinceEvent time.Duration)
	WebhookQueue(n int)
}

// Opener opens sealed secrets (*secret.Sealer).
type Opener interface {
	Open(sealed, context string) (string, error)
}

// DispatcherConfig wires a Dispatcher.
type DispatcherConfig struct {
	Store  store.Store
	Sealer Opener
	Sender *Sender
	// Owner names this process in the webhooks' leases: stable across
	// its restarts (a restarted process takes its leases back at once),
	// distinct from every other process on the store. Default: random.
	Owner string
	// Retries after the first attempt, RetryInterval apart (E2B: 3, 10 s).
	Retries       int
	RetryInterval time.Duration
	// PollInterval is how often the store is asked for due deliveries.
	PollInterval time.Duration
	// LeaseTTL is how long a webhook's lease lasts unrenewed: another
	// process takes over a dead one's webhooks after it.
	LeaseTTL time.Duration
	// MaxWorkers bounds the webhooks this process delivers at once (one
	// worker each), MaxTeamWorkers those of one team (so that a team's
	// slow endpoints never hold every worker); MaxQueue a webhook's
	// pending deliveries (past it the newest are dropped, failed).
	MaxWorkers, MaxTeamWorkers, MaxQueue int
	// Retention is how long events and delivery records are kept.
	Retention time.Duration
	Observer  Observer
	Logger    *slog.Logger
}

// Dispatcher delivers the store's pending deliveries: each webhook by one
// worker at a time, in the order its events were made, under the
// webhook's lease in the store, so that in a cluster one process delivers
// each. A slow or dead endpoint holds only its own worker.
type Dispatcher struct {
	cfg DispatcherConfig
	log *slog.Logger

	mu      sync.Mutex
	running map[string]bool // webhooks a worker here delivers
	perTeam map[string]int  // those workers by team
	wg      sync.WaitGroup
}

// NewDispatcher fills cfg's defaults.
func NewDispatcher(cfg DispatcherConfig) *Dispatcher {
	if cfg.Owner == "" {
		cfg.Owner = uuid.NewString()
	}
	if cfg.Retries < 0 {
		cfg.Retries = 0
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.MaxWorkers <= 0 {
		cfg.MaxWorkers = DefaultMaxWorkers
	}
	if cfg.MaxTeamWorkers <= 0 {
		cfg.MaxTeamWorkers = DefaultMaxTeamWorkers
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Dispatcher{cfg: cfg, log: cfg.Logger, running: map[string]bool{}, perTeam: map[string]int{}}
}

// Run delivers until ctx ends, then waits for its workers.
func (d *Dispatcher) Run(ctx context.Context) {
	defer d.wg.Wait()
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	var lastCount, lastPrune time.Time
	for {
		now := time.Now()
		d.startDue(ctx, now)
		if now.Sub(lastCount) >= 5*time.Second && d.cfg.Observer != nil {
			if n, err := d.cfg.Store.PendingDeliveries(ctx); err == nil {
				d.cfg.Observer.WebhookQueue(n)
			}
			lastCount = now
		}
		if now.Sub(lastPrune) >= time.Hour {
			if n, err := d.cfg.Store.PruneEvents(ctx, now.Add(-d.cfg.Retention)); err != nil && ctx.Err() == nil {
				d.log.Warn("pruning old sandbox events", "err", err)
			} else if n > 0 {
				d.log.Info("pruned old sandbox events", "count", n)
			}
			lastPrune = now
		}
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		}
	}
}

// startDue starts a worker for each webhook with a due delivery that no
// worker here delivers, as far as MaxWorkers allows and its lease is had.
func (d *Dispatcher) startDue(ctx context.Context, now time.Time) {
	d.mu.Lock()
	free := d.cfg.MaxWorkers - len(d.running)
	d.mu.Unlock()
	if free <= 0 {
		return
	}
	// More than fit: a team at its bound must not hide another's.
	due, err := d.cfg.Store.DueWebhooks(ctx, d.cfg.Owner, now, 4*d.cfg.MaxWorkers)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("listing due webhook deliveries", "err", err)
		}
		return
	}
	for _, w := range due {
		if free == 0 {
			return
		}
		d.mu.Lock()
		skip := d.running[w.ID] || d.perTeam[w.TeamID] >= d.cfg.MaxTeamWorkers
		d.mu.Unlock()
		if skip {
			continue
		}
		ok, err := d.cfg.Store.LeaseWebhook(ctx, w.ID, d.cfg.Owner, now, now.Add(d.cfg.LeaseTTL))
		if err != nil || !ok {
			continue // another process delivers it
		}
		d.mu.Lock()
		d.running[w.ID] = true
		d.perTeam[w.TeamID]++
		d.mu.Unlock()
		free--
		d.wg.Add(1)
		go d.work(ctx, w)
	}
}

// work delivers a webhook's pending deliveries in order while this
// process holds its lease, and gives the lease back when none is left.
func (d *Dispatcher) work(ctx context.Context, due store.DueWebhook) {
	id := due.ID
	defer d.wg.Done()
	defer func() {
		d.mu.Lock()
		delete(d.running, id)
		if d.perTeam[due.TeamID]--; d.perTeam[due.TeamID] <= 0 {
			delete(d.perTeam, due.TeamID)
		}
		d.mu.Unlock()
	}()
	release := true
	defer func() {
		if release {
			if err := d.cfg.Store.ReleaseWebhook(context.WithoutCancel(ctx), id, d.cfg.Owner); err != nil {
				d.log.Warn("releasing a webhook's lease", "webhook", id, "err", err)
			}
		}
	}()
	for ctx.Err() == nil {
		now := time.Now()
		if ok, err := d.cfg.Store.LeaseWebhook(ctx, id, d.cfg.Owner, now, now.Add(d.cfg.LeaseTTL)); err != nil || !ok {
			release = false
			return
		}
		if n, err := d.cfg.Store.DropDeliveries(ctx, id, d.cfg.MaxQueue); err == nil && n > 0 {
			d.log.Warn("a webhook's queue is full: its newest deliveries are dropped", "webhook", id, "dropped", n)
			for range n {
				d.observe("dropped", 0)
			}
		}
		del, w, ok, err := d.cfg.Store.NextDelivery(ctx, id)
		if err != nil || !ok || !w.Enabled {
			if err != nil && ctx.Err() == nil {
				d.log.Warn("reading a webhook's next delivery", "webhook", id, "err", err)
			}
			return
		}
		if wait := time.Until(del.NextAt); wait > 0 {
			// A retry waits its turn; the deliveries after it wait for it
			// (in order).
			select {
			case <-ctx.Done():
				return
			case <-time.After(min(wait, d.cfg.LeaseTTL/3)):
			}
			continue
		}
		if !d.attempt(ctx, w, del) {
			release = false
			return
		}
	}
}

// attempt makes one attempt at a delivery and records it; false if the
// lease was lost meanwhile.
func (d *Dispatcher) attempt(ctx context.Context, w store.Webhook, del store.Delivery) bool {
	secret, err := d.cfg.Sealer.Open(w.Secret, SecretContext(w.TeamID, w.ID))
	var a Attempt
	if err != nil {
		a = Attempt{DeliveryID: uuid.NewString(), Err: errors.New("the webhook's secret does not open with this process's key")}
	} else {
		a = d.cfg.Sender.Send(ctx, w.ID, w.URL, secret, del.Event.Body)
	}
	if ctx.Err() != nil {
		return true // shutting down: tried again at the next start
	}
	n := del.Attempts + 1
	out := store.DeliveryOutcome{State: store.DeliveryDelivered}
	outcome := "delivered"
	msg := ""
	if a.Err != nil {
		msg = a.Err.Error()
		if n <= d.cfg.Retries && !errors.Is(a.Err, ErrRefused) {
			out = store.DeliveryOutcome{State: store.DeliveryPending, NextAt: time.Now().Add(d.cfg.RetryInterval)}
			outcome = "retry"
		} else {
			out = store.DeliveryOutcome{State: store.DeliveryFailed}
			outcome = "failed"
		}
	}
	err = d.cfg.Store.RecordAttempt(context.WithoutCancel(ctx), d.cfg.Owner, store.DeliveryAttempt{
		ID: a.DeliveryID, WebhookID: w.ID, EventID: del.Event.ID, EventType: del.Event.Type, Attempt: n,
		Status: a.Status, Duration: a.Duration, Error: msg,
	}, out)
	if err != nil {
		if !errors.Is(err, store.ErrConflict) {
			d.log.Warn("recording a webhook delivery attempt", "webhook", w.ID, "event", del.Event.ID, "err", err)
		}
		return false
	}
	d.observe(outcome, time.Since(del.Event.CreatedAt))
	if a.Err != nil {
		d.log.Info("webhook delivery attempt failed", "webhook", w.ID, "event", del.Event.ID, "attempt", n, "outcome", outcome, "err", a.Err)
	}
	return true
}

func (d *Dispatcher) observe(outcome string, since time.Duration) {
	if d.cfg.Observer != nil {
		d.cfg.Observer.WebhookAttempt(outcome, since)
	}
}

// SecretContext binds a webhook's sealed secret to its team and ID: a
// sealed value moved to another row does not open.
func SecretContext(teamID, id string) string {
	return "webhook\x00" + teamID + "\x00" + id
}
