package store

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// eventSetup makes two teams, a webhook of team1 taking every event, a
// disabled one, one taking only killed, and a creating sandbox of team1.
func eventSetup(t *testing.T, s Store) {
	t.Helper()
	ctx := context.Background()
	for _, id := range []string{"team1", "team2"} {
		if err := s.CreateTeam(ctx, Team{ID: id, Name: id, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	hooks := []Webhook{
		{ID: "wh-all", TeamID: "team1", Name: "all", URL: "http://a", Enabled: true, Events: EventTypes, Secret: "sealed", CreatedAt: t0},
		{ID: "wh-off", TeamID: "team1", Name: "off", URL: "http://b", Enabled: false, Events: EventTypes, Secret: "sealed", CreatedAt: t0.Add(time.Second)},
		{ID: "wh-kill", TeamID: "team1", Name: "kill", URL: "http://c", Enabled: true, Events: []string{EventKilled}, Secret: "sealed", CreatedAt: t0.Add(2 * time.Second)},
		{ID: "wh-2", TeamID: "team2", Name: "other", URL: "http://d", Enabled: true, Events: EventTypes, Secret: "sealed", CreatedAt: t0},
	}
	for _, w := range hooks {
		if err := s.CreateWebhook(ctx, w, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateSandbox(ctx, Sandbox{ID: "sb1", TeamID: "team1", TemplateID: "base", State: StateCreating,
		CPUCount: 2, MemoryMB: 512, Metadata: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
}

func setState(t *testing.T, s Store, id string, change func(*Sandbox)) {
	t.Helper()
	if _, err := s.UpdateSandbox(context.Background(), id, func(sb *Sandbox) error { change(sb); return nil }); err != nil {
		t.Fatal(err)
	}
}

func eventTypes(evs []SandboxEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// TestSandboxChangesMakeEvents walks a sandbox through its lifecycle and
// checks the events its record's changes make, their payload, the
// deliveries each webhook gets, and the polling filters.
func TestSandboxChangesMakeEvents(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		eventSetup(t, s)
		start := time.Now()
		setState(t, s, "sb1", func(sb *Sandbox) { sb.State, sb.StartedAt, sb.EndAt = StateRunning, start, start.Add(time.Minute) })
		setState(t, s, "sb1", func(sb *Sandbox) { sb.EndAt = start.Add(2 * time.Minute) })
		setState(t, s, "sb1", func(sb *Sandbox) { sb.Node = "elsewhere" }) // no event
		setState(t, s, "sb1", func(sb *Sandbox) { sb.State, sb.PausedAt = StatePaused, time.Now() })
		setState(t, s, "sb1", func(sb *Sandbox) { sb.State, sb.PausedAt = StateRunning, time.Time{} })
		// A resume's second write, its new term: no update.
		setState(t, s, "sb1", func(sb *Sandbox) { sb.StartedAt, sb.EndAt = time.Now(), time.Now().Add(time.Hour) })
		// A snapshot's tag makes the checkpointed event.
		if err := s.CreateTemplate(ctx, Template{ID: "snap", TeamID: "team1", CreatedAt: t0, UpdatedAt: t0, SnapshotOf: "sb1"}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateBuild(ctx, Build{ID: "b1", TemplateID: "snap", Status: BuildReady, CreatedAt: t0, UpdatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTag(ctx, Tag{TemplateID: "snap", Tag: "default", BuildID: "b1", SnapshotOf: "sb1"}); err != nil {
			t.Fatal(err)
		}
		// A failed update makes none.
		boom := errors.New("boom")
		if _, err := s.UpdateSandbox(ctx, "sb1", func(sb *Sandbox) error { sb.State = StateKilled; return boom }); !errors.Is(err, boom) {
			t.Fatalf("update = %v", err)
		}
		setState(t, s, "sb1", func(sb *Sandbox) { sb.State = StateKilled })
		if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
			t.Fatal(err)
		}

		want := []string{EventCreated, EventUpdated, EventPaused, EventResumed, EventCheckpointed, EventKilled}
		evs, err := s.ListSandboxEvents(ctx, EventFilter{TeamID: "team1", Asc: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := eventTypes(evs); !slices.Equal(got, want) {
			t.Fatalf("events = %v, want %v", got, want)
		}
		for i, e := range evs {
			if e.Seq != int64(i+1) {
				t.Errorf("event %d has seq %d", i, e.Seq)
			}
			var body map[string]any
			if err := json.Unmarshal(e.Body, &body); err != nil {
				t.Fatal(err)
			}
			if body["id"] != e.ID || body["type"] != e.Type || body["sandboxId"] != "sb1" || body["sandboxTeamId"] != "team1" ||
				body["version"] != "v2" || body["sandboxTemplateId"] != "base" {
				t.Errorf("event %d body = %s", i, e.Body)
			}
			data := body["eventData"].(map[string]any)
			if md, _ := data["sandbox_metadata"].(map[string]any); md["k"] != "v" {
				t.Errorf("event %d metadata = %v", i, data)
			}
			_, hasExec := data["execution"]
			if wantExec := e.Type == EventPaused || e.Type == EventKilled; hasExec != wantExec {
				t.Errorf("event %s: execution present %v", e.Type, hasExec)
			}
		}
		var upd map[string]any
		json.Unmarshal(evs[1].Body, &upd)
		if _, ok := upd["eventData"].(map[string]any)["set_timeout"]; !ok {
			t.Errorf("updated event without set_timeout: %s", evs[1].Body)
		}

		// Polling: newest first by default, types, limit and offset;
		// another team, or none, sees nothing.
		desc, _ := s.ListSandboxEvents(ctx, EventFilter{TeamID: "team1", SandboxID: "sb1"})
		if got := eventTypes(desc); !slices.Equal(got, []string{EventKilled, EventCheckpointed, EventResumed, EventPaused, EventUpdated, EventCreated}) {
			t.Errorf("newest first = %v", got)
		}
		page, _ := s.ListSandboxEvents(ctx, EventFilter{TeamID: "team1", Asc: true, Offset: 1, Limit: 2})
		if got := eventTypes(page); !slices.Equal(got, want[1:3]) {
			t.Errorf("offset 1 limit 2 = %v", got)
		}
		typed, _ := s.ListSandboxEvents(ctx, EventFilter{TeamID: "team1", Types: []string{EventCreated, EventKilled}, Asc: true})
		if got := eventTypes(typed); !slices.Equal(got, []string{EventCreated, EventKilled}) {
			t.Errorf("types = %v", got)
		}
		for _, f := range []EventFilter{{TeamID: "team2"}, {}, {TeamID: "team2", SandboxID: "sb1"}} {
			if evs, err := s.ListSandboxEvents(ctx, f); err != nil || len(evs) != 0 {
				t.Errorf("%+v: %d events, %v", f, len(evs), err)
			}
		}

		// Deliveries: every event to wh-all, in order; killed to wh-kill;
		// nothing to the disabled one or the other team's.
		var got []string
		lease(t, s, "wh-all")
		for {
			d, w, ok, err := s.NextDelivery(ctx, "wh-all")
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if w.ID != "wh-all" {
				t.Fatalf("webhook %s", w.ID)
			}
			got = append(got, d.Event.Type)
			if err := s.RecordAttempt(ctx, "me", DeliveryAttempt{ID: d.Event.ID + "-1", WebhookID: "wh-all", EventID: d.Event.ID, EventType: d.Event.Type, Attempt: 1, Status: 200, CreatedAt: t0.Add(time.Duration(len(got)) * time.Second)}, DeliveryOutcome{State: DeliveryDelivered}); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("wh-all got %v", got)
		}
		if d, _, ok, _ := s.NextDelivery(ctx, "wh-kill"); !ok || d.Event.Type != EventKilled {
			t.Errorf("wh-kill next = %+v %v", d, ok)
		}
		for _, id := range []string{"wh-off", "wh-2"} {
			if _, _, ok, _ := s.NextDelivery(ctx, id); ok {
				t.Errorf("%s has a delivery", id)
			}
		}
		if n, _ := s.PendingDeliveries(ctx); n != 1 {
			t.Errorf("pending = %d, want 1 (wh-kill's)", n)
		}
		if a, err := s.ListWebhookAttempts(ctx, "team1", "wh-all", 3); err != nil || len(a) != 3 || a[0].EventType != EventKilled {
			t.Errorf("attempts = %+v %v", a, err)
		}
		if _, err := s.ListWebhookAttempts(ctx, "team2", "wh-all", 3); !errors.Is(err, ErrNotFound) {
			t.Errorf("another team's attempts: %v", err)
		}
	})
}

func lease(t *testing.T, s Store, id string) {
	t.Helper()
	now := time.Now()
	if ok, err := s.LeaseWebhook(context.Background(), id, "me", now, now.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("lease %s: %v %v", id, ok, err)
	}
}

// TestEventCommitsWithItsChange makes the event's delivery insert fail
// inside the sandbox's transaction: the sandbox's change must not commit
// either (and no event be left): one transaction, not two writes.
func TestEventCommitsWithItsChange(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		eventSetup(t, s)
		db := s.(*SQL)
		stmt := "CREATE TRIGGER no_deliveries BEFORE INSERT ON webhook_deliveries BEGIN SELECT RAISE(ABORT, 'refused'); END"
		if db.d == postgresDialect {
			stmt = "ALTER TABLE webhook_deliveries ADD CONSTRAINT no_deliveries CHECK (seq < 0)"
		}
		if _, err := db.db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
		_, err := s.UpdateSandbox(ctx, "sb1", func(sb *Sandbox) error { sb.State = StateRunning; return nil })
		if err == nil {
			t.Fatal("the update committed though its event's delivery could not be written")
		}
		sb, err := s.GetSandbox(ctx, "sb1")
		if err != nil || sb.State != StateCreating {
			t.Errorf("sandbox after the failed transaction = %s %v, want creating", sb.State, err)
		}
		if evs, _ := s.ListSandboxEvents(ctx, EventFilter{TeamID: "team1"}); len(evs) != 0 {
			t.Errorf("%d events of a change that did not commit", len(evs))
		}
	})
}

// TestOutboxSurvivesReopen: what was committed before a process died is
// there, pending, for the next one.
func TestOutboxSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "warren.db")
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	eventSetup(t, s)
	setState(t, s, "sb1", func(sb *Sandbox) { sb.State = StateRunning })
	s.Close() // no delivery was made
	s, err = OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ids, err := s.DueWebhooks(ctx, "next", time.Now(), 10)
	if err != nil || !slices.Equal(ids, []DueWebhook{{ID: "wh-all", TeamID: "team1"}}) {
		t.Fatalf("due after reopen = %v %v", ids, err)
	}
	if d, _, ok, err := s.NextDelivery(ctx, "wh-all"); err != nil || !ok || d.Event.Type != EventCreated {
		t.Errorf("next = %+v %v %v", d, ok, err)
	}
}

// TestWebhooksAreTheTeams: CRUD scoped by team, the per-team bound,
// disabling and deleting drop what was queued, leases are exclusive.
func TestWebhooksAreTheTeams(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		eventSetup(t, s)
		if err := s.CreateWebhook(ctx, Webhook{ID: "wh-x", TeamID: "team1", URL: "http://x", Events: EventTypes}, 3); !errors.Is(err, ErrLimit) {
			t.Errorf("fourth webhook with a bound of 3: %v", err)
		}
		if err := s.CreateWebhook(ctx, Webhook{ID: "wh-y", TeamID: "", URL: "http://x", Events: EventTypes}, 0); err == nil {
			t.Error("a webhook of no team was created")
		}
		if _, err := s.GetWebhook(ctx, "team2", "wh-all"); !errors.Is(err, ErrNotFound) {
			t.Errorf("another team's webhook: %v", err)
		}
		if _, err := s.GetWebhook(ctx, "", "wh-all"); !errors.Is(err, ErrNotFound) {
			t.Errorf("no team's webhook: %v", err)
		}
		if _, err := s.UpdateWebhook(ctx, "team2", "wh-all", func(w *Webhook) error { w.Name = "mine"; return nil }); !errors.Is(err, ErrNotFound) {
			t.Errorf("updating another team's: %v", err)
		}
		if err := s.DeleteWebhook(ctx, "team2", "wh-all"); !errors.Is(err, ErrNotFound) {
			t.Errorf("deleting another team's: %v", err)
		}
		if ws, _ := s.ListWebhooks(ctx, ""); len(ws) != 0 {
			t.Errorf("no team lists %d", len(ws))
		}
		if ws, _ := s.ListWebhooks(ctx, "team1"); len(ws) != 3 {
			t.Errorf("team1 lists %d", len(ws))
		}
		setState(t, s, "sb1", func(sb *Sandbox) { sb.State = StateRunning })
		// Leases: one holder at a time; an expired one is taken over.
		now := time.Now()
		if ok, _ := s.LeaseWebhook(ctx, "wh-all", "p1", now, now.Add(time.Minute)); !ok {
			t.Fatal("p1 did not get a free lease")
		}
		if ok, _ := s.LeaseWebhook(ctx, "wh-all", "p2", now, now.Add(time.Minute)); ok {
			t.Error("p2 got p1's live lease")
		}
		if ids, _ := s.DueWebhooks(ctx, "p2", now, 10); len(ids) != 0 {
			t.Errorf("p2 sees due webhooks %v under p1's lease", ids)
		}
		if err := s.RecordAttempt(ctx, "p2", DeliveryAttempt{ID: "x", WebhookID: "wh-all", EventID: "e"}, DeliveryOutcome{State: DeliveryDelivered}); !errors.Is(err, ErrConflict) {
			t.Errorf("p2 recorded without the lease: %v", err)
		}
		if ok, _ := s.LeaseWebhook(ctx, "wh-all", "p2", now.Add(2*time.Minute), now.Add(3*time.Minute)); !ok {
			t.Error("p2 did not take over an expired lease")
		}
		// Disabling drops the queue; so does deleting.
		if _, err := s.UpdateWebhook(ctx, "team1", "wh-all", func(w *Webhook) error { w.Enabled = false; return nil }); err != nil {
			t.Fatal(err)
		}
		if _, _, ok, _ := s.NextDelivery(ctx, "wh-all"); ok {
			t.Error("a disabled webhook has a delivery")
		}
		setState(t, s, "sb1", func(sb *Sandbox) { sb.State = StateKilled })
		if _, _, ok, _ := s.NextDelivery(ctx, "wh-kill"); !ok {
			t.Fatal("wh-kill has no delivery")
		}
		if err := s.DeleteWebhook(ctx, "team1", "wh-kill"); err != nil {
			t.Fatal(err)
		}
		if n, _ := s.PendingDeliveries(ctx); n != 0 {
			t.Errorf("pending = %d after disabling one webhook and deleting the other", n)
		}
	})
}

// TestDropDeliveriesBoundsTheQueue keeps the oldest pending deliveries.
func TestDropDeliveriesBoundsTheQueue(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		eventSetup(t, s)
		start := time.Now()
		setState(t, s, "sb1", func(sb *Sandbox) { sb.State = StateRunning })
		for i := range 4 {
			setState(t, s, "sb1", func(sb *Sandbox) { sb.EndAt = start.Add(time.Duration(i+1) * time.Minute) })
		}
		n, err := s.DropDeliveries(ctx, "wh-all", 2)
		if err != nil || n != 3 {
			t.Fatalf("dropped %d, %v; want 3 of 5", n, err)
		}
		if d, _, ok, _ := s.NextDelivery(ctx, "wh-all"); !ok || d.Event.Type != EventCreated {
			t.Errorf("the oldest was not kept: %+v", d)
		}
		if n, _ := s.DropDeliveries(ctx, "wh-all", 2); n != 0 {
			t.Errorf("dropped %d more", n)
		}
		if n, _ := s.PruneEvents(ctx, time.Now().Add(time.Hour)); n != 3 {
			t.Errorf("pruned %d events, want the 3 not pending", n)
		}
	})
}

// TestNetworkUpdateIsAnUpdate: a new network (extra) of a running
// sandbox is an updated event; its node or slot moving is none.
func TestNetworkUpdateIsAnUpdate(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		eventSetup(t, s)
		setState(t, s, "sb1", func(sb *Sandbox) { sb.State = StateRunning })
		setState(t, s, "sb1", func(sb *Sandbox) { sb.Slot = "elsewhere" })
		setState(t, s, "sb1", func(sb *Sandbox) { sb.Extra = `{"network":{"denyOut":["0.0.0.0/0"]}}` })
		evs, err := s.ListSandboxEvents(ctx, EventFilter{TeamID: "team1", Asc: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := eventTypes(evs); !slices.Equal(got, []string{EventCreated, EventUpdated}) {
			t.Fatalf("events = %v", got)
		}
		var body struct{ EventData map[string]any }
		json.Unmarshal(evs[1].Body, &body)
		if body.EventData["network_updated"] != true {
			t.Errorf("updated event data = %v", body.EventData)
		}
	})
}
