package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Events are derived from what a transaction changes in a sandbox's
// record, so that every path that changes it (the API, the reaper's
// timeouts and auto-pauses, a cluster node) makes the same events, in the
// same transaction as the change.

// eventTimeFormat is the events' timestamps: RFC 3339 in UTC, to the ms.
const eventTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// sandboxChange is an event a change of a sandbox's record makes.
type sandboxChange struct {
	typ  string
	data map[string]any
}

// changesOf are the events of a sandbox's record going from before to
// after: created (creating → running), paused, resumed, killed (of a
// sandbox that was running or paused), updated (a new end of its term, or
// a new network, while it runs or is paused).
func changesOf(before, after *Sandbox) []sandboxChange {
	live := func(st SandboxState) bool { return st == StateRunning || st == StatePaused }
	switch {
	case before.State == StateCreating && after.State == StateRunning:
		return []sandboxChange{{typ: EventCreated}}
	case before.State == StatePaused && after.State == StateRunning:
		return []sandboxChange{{typ: EventResumed}}
	case before.State == StateRunning && after.State == StatePaused:
		return []sandboxChange{{typ: EventPaused, data: map[string]any{"execution": execution(before, after.PausedAt)}}}
	case live(before.State) && after.State == StateKilled:
		return []sandboxChange{{typ: EventKilled, data: map[string]any{"execution": execution(before, time.Now())}}}
	case before.State == after.State && live(after.State):
		var out []sandboxChange
		// A new term (StartedAt moves: a resume's second write) is not an
		// update of the timeout; a new end of the same term is.
		if !before.EndAt.Equal(after.EndAt) && before.StartedAt.Equal(after.StartedAt) {
			out = append(out, sandboxChange{typ: EventUpdated, data: map[string]any{"set_timeout": after.EndAt.UTC().Format(eventTimeFormat)}})
		}
		if before.Extra != after.Extra || !sameBool(before.AllowInternetAccess, after.AllowInternetAccess) {
			out = append(out, sandboxChange{typ: EventUpdated, data: map[string]any{"network_updated": true}})
		}
		return out
	}
	return nil
}

func sameBool(a, b *bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// execution is E2B's eventData.execution of a paused or killed sandbox:
// its current term's start, resources and run time (ms) until end.
func execution(sb *Sandbox, end time.Time) map[string]any {
	ran := int64(0)
	if sb.State == StateRunning && !sb.StartedAt.IsZero() && end.After(sb.StartedAt) {
		ran = end.Sub(sb.StartedAt).Milliseconds()
	}
	return map[string]any{
		"started_at":     sb.StartedAt.UTC().Format(time.RFC3339),
		"vcpu_count":     sb.CPUCount,
		"memory_mb":      sb.MemoryMB,
		"execution_time": ran,
	}
}

// executionID names a sandbox's current term (E2B's sandboxExecutionId):
// the same for every event between a start or resume and the next.
func executionID(sb *Sandbox) string {
	sum := sha256.Sum256([]byte(sb.ID + "\x00" + strconv.FormatInt(ms(sb.StartedAt), 10)))
	id, _ := uuid.FromBytes(sum[:16])
	return id.String()
}

// eventBody is an event's JSON: E2B's webhook payload (version v2).
type eventBody struct {
	Version            string         `json:"version"`
	ID                 string         `json:"id"`
	Type               string         `json:"type"`
	EventData          map[string]any `json:"eventData"`
	SandboxBuildID     string         `json:"sandboxBuildId"`
	SandboxExecutionID string         `json:"sandboxExecutionId"`
	SandboxID          string         `json:"sandboxId"`
	SandboxTeamID      string         `json:"sandboxTeamId"`
	SandboxTemplateID  string         `json:"sandboxTemplateId"`
	Timestamp          string         `json:"timestamp"`
}

// insertEvent writes an event of sandbox sb, in tx, with a delivery for
// each of its team's enabled webhooks that take its type.
func (s *SQL) insertEvent(ctx context.Context, tx *sql.Tx, sb *Sandbox, c sandboxChange) error {
	var seq, last int64
	if err := tx.QueryRowContext(ctx, s.q("SELECT COALESCE(MAX(seq), 0), COALESCE(MAX(created_at), 0) FROM sandbox_events WHERE sandbox_id = ?"), sb.ID).Scan(&seq, &last); err != nil {
		return err
	}
	// One sandbox's events never go back in time, whichever process's
	// clock made them: they are delivered in (created_at, seq) order.
	created := max(time.Now().UnixMilli(), last)
	var build string
	err := tx.QueryRowContext(ctx, s.q("SELECT build_id FROM template_tags WHERE template_id = ? AND tag = 'default'"), sb.TemplateID).Scan(&build)
	if err != nil && err != sql.ErrNoRows {
		return err
	}
	data := map[string]any{"sandbox_metadata": orEmpty(sb.Metadata)}
	for k, v := range c.data {
		data[k] = v
	}
	ev := eventBody{Version: "v2", ID: uuid.NewString(), Type: c.typ, EventData: data,
		SandboxBuildID: build, SandboxExecutionID: executionID(sb), SandboxID: sb.ID, SandboxTeamID: sb.TeamID,
		SandboxTemplateID: sb.TemplateID, Timestamp: time.UnixMilli(created).UTC().Format(eventTimeFormat)}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.q("INSERT INTO sandbox_events (id, team_id, sandbox_id, seq, type, created_at, body) VALUES (?, ?, ?, ?, ?, ?, ?)"),
		ev.ID, sb.TeamID, sb.ID, seq+1, c.typ, created, string(body)); err != nil {
		return err
	}
	hooks, err := queryAllTx(ctx, tx, s.q("SELECT "+webhookColumns+" FROM webhooks WHERE team_id = ? AND enabled = 1"), scanWebhook, sb.TeamID)
	if err != nil {
		return err
	}
	for _, w := range hooks {
		if !w.Subscribes(c.typ) {
			continue
		}
		if _, err := tx.ExecContext(ctx, s.q("INSERT INTO webhook_deliveries (webhook_id, event_id, team_id, sandbox_id, seq, created_at, state, attempts, next_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)"),
			w.ID, ev.ID, sb.TeamID, sb.ID, seq+1, created, DeliveryPending, created, created); err != nil {
			return err
		}
	}
	return nil
}

// insertChanges writes the events of a sandbox's change from before to
// after, in tx.
func (s *SQL) insertChanges(ctx context.Context, tx *sql.Tx, before, after *Sandbox) error {
	for _, c := range changesOf(before, after) {
		if err := s.insertEvent(ctx, tx, after, c); err != nil {
			return fmt.Errorf("store: recording an event of sandbox %s: %w", after.ID, err)
		}
	}
	return nil
}

// insertSnapshotEvent writes a checkpointed event of sandbox id, in tx,
// if its record is still there (a snapshot of a sandbox killed meanwhile
// has no one to tell).
func (s *SQL) insertSnapshotEvent(ctx context.Context, tx *sql.Tx, sandboxID string) error {
	sb, err := scanSandbox(tx.QueryRowContext(ctx, s.q("SELECT "+sandboxColumns+" FROM sandboxes WHERE id = ?"), sandboxID))
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		return err
	}
	return s.insertEvent(ctx, tx, &sb, sandboxChange{typ: EventCheckpointed})
}

func queryAllTx[T any](ctx context.Context, tx *sql.Tx, query string, scan func(interface{ Scan(...any) error }) (T, error), args ...any) ([]T, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Events.

const eventColumns = "id, team_id, sandbox_id, seq, type, created_at, body"

func scanEvent(row interface{ Scan(...any) error }) (SandboxEvent, error) {
	var e SandboxEvent
	var created int64
	var body string
	err := row.Scan(&e.ID, &e.TeamID, &e.SandboxID, &e.Seq, &e.Type, &created, &body)
	e.CreatedAt, e.Body = fromMS(created), []byte(body)
	return e, err
}

func (s *SQL) ListSandboxEvents(ctx context.Context, f EventFilter) ([]SandboxEvent, error) {
	if f.TeamID == "" {
		return nil, nil // an empty team matches nothing
	}
	where := []string{"team_id = ?"}
	args := []any{f.TeamID}
	if f.SandboxID != "" {
		where = append(where, "sandbox_id = ?")
		args = append(args, f.SandboxID)
	}
	if len(f.Types) > 0 {
		where = append(where, "type IN ("+strings.TrimSuffix(strings.Repeat("?, ", len(f.Types)), ", ")+")")
		for _, t := range f.Types {
			args = append(args, t)
		}
	}
	order := " ORDER BY created_at DESC, seq DESC, id DESC"
	if f.Asc {
		order = " ORDER BY created_at, seq, id"
	}
	query := "SELECT " + eventColumns + " FROM sandbox_events WHERE " + strings.Join(where, " AND ") + order
	if f.Limit > 0 {
		query += " LIMIT " + strconv.Itoa(f.Limit)
	} else if f.Offset > 0 {
		query += " LIMIT -1"
		if s.d == postgresDialect {
			query = strings.TrimSuffix(query, " LIMIT -1") + " LIMIT ALL"
		}
	}
	if f.Offset > 0 {
		query += " OFFSET " + strconv.Itoa(f.Offset)
	}
	return queryAll(ctx, s.db, s.q(query), scanEvent, args...)
}

// Webhooks.

const webhookColumns = "id, team_id, name, url, enabled, events, secret, created_at, updated_at"

func scanWebhook(row interface{ Scan(...any) error }) (Webhook, error) {
	var w Webhook
	var enabled int
	var events string
	var created, updated int64
	if err := row.Scan(&w.ID, &w.TeamID, &w.Name, &w.URL, &enabled, &events, &w.Secret, &created, &updated); err != nil {
		return w, err
	}
	w.Enabled, w.CreatedAt, w.UpdatedAt = enabled != 0, fromMS(created), fromMS(updated)
	if err := json.Unmarshal([]byte(events), &w.Events); err != nil {
		return w, fmt.Errorf("store: webhook %s events: %w", w.ID, err)
	}
	return w, nil
}

func webhookArgs(w *Webhook) ([]any, error) {
	events, err := json.Marshal(orNoEvents(w.Events))
	if err != nil {
		return nil, err
	}
	return []any{w.ID, w.TeamID, w.Name, w.URL, b2i(w.Enabled), string(events), w.Secret, ms(w.CreatedAt), ms(w.UpdatedAt)}, nil
}

func orNoEvents(e []string) []string {
	if e == nil {
		return []string{}
	}
	return e
}

func (s *SQL) CreateWebhook(ctx context.Context, w Webhook, maxPerTeam int) error {
	if w.TeamID == "" {
		return fmt.Errorf("store: webhook %s: no team", w.ID)
	}
	if w.CreatedAt.IsZero() {
		w.CreatedAt = time.Now()
	}
	if w.UpdatedAt.IsZero() {
		w.UpdatedAt = w.CreatedAt
	}
	args, err := webhookArgs(&w)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if maxPerTeam > 0 {
		// The team's row is locked so that concurrent creates count in
		// turn (PostgreSQL; SQLite's write transactions are exclusive).
		var id string
		if err := tx.QueryRowContext(ctx, s.q("SELECT id FROM teams WHERE id = ?"+s.forUpdate()), w.TeamID).Scan(&id); err != nil {
			return notFound("team", w.TeamID, err)
		}
		var n int
		if err := tx.QueryRowContext(ctx, s.q("SELECT COUNT(*) FROM webhooks WHERE team_id = ?"), w.TeamID).Scan(&n); err != nil {
			return err
		}
		if n >= maxPerTeam {
			return fmt.Errorf("store: the team has %d webhooks: %w", n, ErrLimit)
		}
	}
	marks := strings.TrimSuffix(strings.Repeat("?, ", len(args)), ", ")
	if _, err := tx.ExecContext(ctx, s.q("INSERT INTO webhooks ("+webhookColumns+") VALUES ("+marks+")"), args...); err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("store: webhook %s: %w", w.ID, ErrConflict)
		}
		return err
	}
	return tx.Commit()
}

func (s *SQL) GetWebhook(ctx context.Context, teamID, id string) (Webhook, error) {
	if teamID == "" {
		return Webhook{}, fmt.Errorf("store: webhook %s: %w", id, ErrNotFound)
	}
	w, err := scanWebhook(s.db.QueryRowContext(ctx, s.q("SELECT "+webhookColumns+" FROM webhooks WHERE id = ? AND team_id = ?"), id, teamID))
	return w, notFound("webhook", id, err)
}

func (s *SQL) ListWebhooks(ctx context.Context, teamID string) ([]Webhook, error) {
	if teamID == "" {
		return nil, nil
	}
	return queryAll(ctx, s.db, s.q("SELECT "+webhookColumns+" FROM webhooks WHERE team_id = ? ORDER BY created_at, id"), scanWebhook, teamID)
}

func (s *SQL) UpdateWebhook(ctx context.Context, teamID, id string, update func(*Webhook) error) (Webhook, error) {
	if teamID == "" {
		return Webhook{}, fmt.Errorf("store: webhook %s: %w", id, ErrNotFound)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Webhook{}, err
	}
	defer tx.Rollback()
	w, err := scanWebhook(tx.QueryRowContext(ctx, s.q("SELECT "+webhookColumns+" FROM webhooks WHERE id = ? AND team_id = ?"+s.forUpdate()), id, teamID))
	if err != nil {
		return Webhook{}, notFound("webhook", id, err)
	}
	if err := update(&w); err != nil {
		return Webhook{}, err
	}
	w.ID, w.TeamID, w.UpdatedAt = id, teamID, time.Now()
	args, err := webhookArgs(&w)
	if err != nil {
		return Webhook{}, err
	}
	if _, err := tx.ExecContext(ctx, s.q(updateByID("webhooks", webhookColumns)), append(args[1:], id)...); err != nil {
		return Webhook{}, err
	}
	if !w.Enabled {
		// A disabled webhook gets nothing, not even what was queued.
		if _, err := tx.ExecContext(ctx, s.q("DELETE FROM webhook_deliveries WHERE webhook_id = ? AND state = ?"), id, DeliveryPending); err != nil {
			return Webhook{}, err
		}
	}
	return w, tx.Commit()
}

func (s *SQL) DeleteWebhook(ctx context.Context, teamID, id string) error {
	if teamID == "" {
		return fmt.Errorf("store: webhook %s: %w", id, ErrNotFound)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, s.q("DELETE FROM webhooks WHERE id = ? AND team_id = ?"), id, teamID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: webhook %s: %w", id, ErrNotFound)
	}
	for _, stmt := range []string{"DELETE FROM webhook_deliveries WHERE webhook_id = ?", "DELETE FROM webhook_attempts WHERE webhook_id = ?"} {
		if _, err := tx.ExecContext(ctx, s.q(stmt), id); err != nil {
			return err
		}
	}
	return tx.Commit()
}

const attemptColumns = "id, webhook_id, event_id, event_type, attempt, status, duration_ms, error, created_at"

func scanAttempt(row interface{ Scan(...any) error }) (DeliveryAttempt, error) {
	var a DeliveryAttempt
	var dur, created int64
	err := row.Scan(&a.ID, &a.WebhookID, &a.EventID, &a.EventType, &a.Attempt, &a.Status, &dur, &a.Error, &created)
	a.Duration, a.CreatedAt = time.Duration(dur)*time.Millisecond, fromMS(created)
	return a, err
}

func (s *SQL) ListWebhookAttempts(ctx context.Context, teamID, webhookID string, limit int) ([]DeliveryAttempt, error) {
	if _, err := s.GetWebhook(ctx, teamID, webhookID); err != nil {
		return nil, err
	}
	query := "SELECT " + attemptColumns + " FROM webhook_attempts WHERE webhook_id = ? ORDER BY created_at DESC, attempt DESC, id DESC"
	if limit > 0 {
		query += " LIMIT " + strconv.Itoa(limit)
	}
	return queryAll(ctx, s.db, s.q(query), scanAttempt, webhookID)
}

// Delivery.

func (s *SQL) DueWebhooks(ctx context.Context, owner string, now time.Time, limit int) ([]DueWebhook, error) {
	query := "SELECT DISTINCT d.webhook_id, w.team_id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id " +
		"WHERE d.state = ? AND d.next_at <= ? AND w.enabled = 1 AND (w.lease_owner = '' OR w.lease_owner = ? OR w.lease_until < ?)"
	if limit > 0 {
		query += " LIMIT " + strconv.Itoa(limit)
	}
	return queryAll(ctx, s.db, s.q(query), func(row interface{ Scan(...any) error }) (DueWebhook, error) {
		var d DueWebhook
		return d, row.Scan(&d.ID, &d.TeamID)
	}, DeliveryPending, ms(now), owner, ms(now))
}

func (s *SQL) LeaseWebhook(ctx context.Context, id, owner string, now, until time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.q("UPDATE webhooks SET lease_owner = ?, lease_until = ? WHERE id = ? AND (lease_owner = '' OR lease_owner = ? OR lease_until < ?)"),
		owner, ms(until), id, owner, ms(now))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (s *SQL) ReleaseWebhook(ctx context.Context, id, owner string) error {
	_, err := s.db.ExecContext(ctx, s.q("UPDATE webhooks SET lease_owner = '', lease_until = 0 WHERE id = ? AND lease_owner = ?"), id, owner)
	return err
}

func (s *SQL) NextDelivery(ctx context.Context, webhookID string) (Delivery, Webhook, bool, error) {
	w, err := scanWebhook(s.db.QueryRowContext(ctx, s.q("SELECT "+webhookColumns+" FROM webhooks WHERE id = ?"), webhookID))
	if err == sql.ErrNoRows {
		return Delivery{}, Webhook{}, false, nil
	}
	if err != nil {
		return Delivery{}, Webhook{}, false, err
	}
	var d Delivery
	var next int64
	row := s.db.QueryRowContext(ctx, s.q("SELECT d.state, d.attempts, d.next_at, "+prefixed("e.", eventColumns)+
		" FROM webhook_deliveries d JOIN sandbox_events e ON e.id = d.event_id WHERE d.webhook_id = ? AND d.state = ? ORDER BY d.created_at, d.seq, d.event_id LIMIT 1"),
		webhookID, DeliveryPending)
	var created int64
	var body string
	err = row.Scan(&d.State, &d.Attempts, &next, &d.Event.ID, &d.Event.TeamID, &d.Event.SandboxID, &d.Event.Seq, &d.Event.Type, &created, &body)
	if err == sql.ErrNoRows {
		return Delivery{}, w, false, nil
	}
	if err != nil {
		return Delivery{}, Webhook{}, false, err
	}
	d.WebhookID, d.NextAt, d.Event.CreatedAt, d.Event.Body = webhookID, fromMS(next), fromMS(created), []byte(body)
	return d, w, true, nil
}

func (s *SQL) RecordAttempt(ctx context.Context, owner string, a DeliveryAttempt, out DeliveryOutcome) error {
	if a.CreatedAt.IsZero() {
		a.CreatedAt = time.Now()
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var holder string
	if err := tx.QueryRowContext(ctx, s.q("SELECT lease_owner FROM webhooks WHERE id = ?"+s.forUpdate()), a.WebhookID).Scan(&holder); err != nil {
		return notFound("webhook", a.WebhookID, err)
	}
	if holder != owner {
		return fmt.Errorf("store: webhook %s is delivered by %q now: %w", a.WebhookID, holder, ErrConflict)
	}
	if _, err := tx.ExecContext(ctx, s.q("INSERT INTO webhook_attempts ("+attemptColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"),
		a.ID, a.WebhookID, a.EventID, a.EventType, a.Attempt, a.Status, a.Duration.Milliseconds(), a.Error, ms(a.CreatedAt)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.q("UPDATE webhook_deliveries SET state = ?, attempts = ?, next_at = ?, updated_at = ? WHERE webhook_id = ? AND event_id = ?"),
		out.State, a.Attempt, ms(out.NextAt), ms(a.CreatedAt), a.WebhookID, a.EventID); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQL) DropDeliveries(ctx context.Context, webhookID string, keep int) (int, error) {
	var cutoff sql.NullInt64
	var cutSeq sql.NullInt64
	var cutID sql.NullString
	err := s.db.QueryRowContext(ctx, s.q("SELECT created_at, seq, event_id FROM webhook_deliveries WHERE webhook_id = ? AND state = ? ORDER BY created_at, seq, event_id LIMIT 1 OFFSET "+strconv.Itoa(keep)),
		webhookID, DeliveryPending).Scan(&cutoff, &cutSeq, &cutID)
	if err == sql.ErrNoRows {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// Every pending delivery from the (keep+1)th on.
	res, err := s.db.ExecContext(ctx, s.q("UPDATE webhook_deliveries SET state = ?, updated_at = ? WHERE webhook_id = ? AND state = ? AND "+
		"(created_at > ? OR (created_at = ? AND (seq > ? OR (seq = ? AND event_id >= ?))))"),
		DeliveryFailed, ms(time.Now()), webhookID, DeliveryPending, cutoff.Int64, cutoff.Int64, cutSeq.Int64, cutSeq.Int64, cutID.String)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

func (s *SQL) PendingDeliveries(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, s.q("SELECT COUNT(*) FROM webhook_deliveries WHERE state = ?"), DeliveryPending).Scan(&n)
	return n, err
}

func (s *SQL) PruneEvents(ctx context.Context, before time.Time) (int, error) {
	cut := ms(before)
	res, err := s.db.ExecContext(ctx, s.q("DELETE FROM sandbox_events WHERE created_at < ? AND NOT EXISTS "+
		"(SELECT 1 FROM webhook_deliveries d WHERE d.event_id = sandbox_events.id AND d.state = ?)"), cut, DeliveryPending)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	if _, err := s.db.ExecContext(ctx, s.q("DELETE FROM webhook_deliveries WHERE created_at < ? AND state <> ?"), cut, DeliveryPending); err != nil {
		return int(n), err
	}
	_, err = s.db.ExecContext(ctx, s.q("DELETE FROM webhook_attempts WHERE created_at < ?"), cut)
	return int(n), err
}
