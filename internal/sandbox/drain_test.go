package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// A node that does not admit (cordoned) refuses creates with
// ErrNoCapacity, naming why; Drain pauses what runs, and Usage counts only
// running sandboxes.
func TestAdmitAndDrain(t *testing.T) {
	var refuse error
	e := startWith(t, newStore(t), Config{PoolSize: -1, Admit: func(context.Context) error { return refuse }}, envOptions{})
	defer e.destroy()
	a, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.create(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if u := e.mgr.Usage(); u.Sandboxes != 2 || u.UsedMemoryMB != 2*256 {
		t.Errorf("usage with two running: %+v", u)
	}
	refuse = errors.New("node n1 is cordoned")
	if _, err := e.create(CreateRequest{}); !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "cordoned") {
		t.Errorf("a create on a node that does not admit: %v", err)
	}
	running, err := e.mgr.Drain(context.Background())
	if err != nil || running != 0 {
		t.Fatalf("Drain: %d still running, %v", running, err)
	}
	for _, id := range []string{a.ID, b.ID} {
		rec, err := e.mgr.Get(context.Background(), team.MustParse("t1"), id)
		if err != nil || rec.State != store.StatePaused {
			t.Errorf("after the drain %s is %s (%v), want paused", id, rec.State, err)
		}
	}
	if u := e.mgr.Usage(); u.Sandboxes != 0 || u.UsedMemoryMB != 0 {
		t.Errorf("usage after the drain: %+v", u)
	}
	for _, id := range []string{a.ID, b.ID} {
		if err := e.mgr.Kill(context.Background(), team.MustParse("t1"), id); err != nil {
			t.Error(err)
		}
	}
}
