package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestDashboardSessions(t *testing.T) {
	for name, st := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			t0 := time.UnixMilli(1_700_000_000_000).UTC()
			sess := func(hash, team string, at time.Time) DashboardSession {
				return DashboardSession{IDHash: hash, TeamID: team, Mask: "e2b_…abcd", Credential: "sealed-" + hash, CreatedAt: at, ExpiresAt: at.Add(time.Hour)}
			}
			a := sess("ha", "t1", t0)
			a.Admin = true
			if err := st.CreateDashboardSession(ctx, a, 3, 10); err != nil {
				t.Fatal(err)
			}
			got, err := st.DashboardSession(ctx, "ha", t0.Add(time.Minute))
			if err != nil || got != a {
				t.Fatalf("read back: %+v, %v; want %+v", got, err, a)
			}
			// Fails closed: an unknown or empty hash, an expired session, no team.
			for _, h := range []string{"", "hb", "HA"} {
				if _, err := st.DashboardSession(ctx, h, t0); !errors.Is(err, ErrNotFound) {
					t.Errorf("hash %q: %v", h, err)
				}
			}
			if _, err := st.DashboardSession(ctx, "ha", t0.Add(time.Hour)); !errors.Is(err, ErrNotFound) {
				t.Errorf("expired session: %v", err)
			}
			if err := st.CreateDashboardSession(ctx, sess("hx", "", t0), 3, 10); err == nil {
				t.Error("a session without a team was kept")
			}
			if err := st.CreateDashboardSession(ctx, sess("ha", "t1", t0), 3, 10); !errors.Is(err, ErrConflict) {
				t.Errorf("a second session with one hash: %v", err)
			}
			// Per team: the fourth of t1 ends its oldest, t2's are untouched.
			for i := 1; i <= 3; i++ {
				if err := st.CreateDashboardSession(ctx, sess(fmt.Sprintf("t1-%d", i), "t1", t0.Add(time.Duration(i)*time.Second)), 3, 10); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.CreateDashboardSession(ctx, sess("t2-1", "t2", t0), 3, 10); err != nil {
				t.Fatal(err)
			}
			now := t0.Add(5 * time.Second)
			for h, live := range map[string]bool{"ha": false, "t1-1": true, "t1-2": true, "t1-3": true, "t2-1": true} {
				if _, err := st.DashboardSession(ctx, h, now); (err == nil) != live {
					t.Errorf("session %s: live %v, want %v (%v)", h, err == nil, live, err)
				}
			}
			// In all: at the bound, refused, nothing kept; expired rows are
			// swept first, which makes room.
			for i := range 6 {
				if err := st.CreateDashboardSession(ctx, sess(fmt.Sprintf("t3-%d", i), fmt.Sprintf("t3-%d", i), now), 3, 10); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.CreateDashboardSession(ctx, sess("full", "t4", now), 3, 10); !errors.Is(err, ErrSessionLimit) {
				t.Fatalf("past the bound: %v", err)
			}
			if _, err := st.DashboardSession(ctx, "full", now); !errors.Is(err, ErrNotFound) {
				t.Errorf("a refused session was kept: %v", err)
			}
			later := t0.Add(time.Hour + 6*time.Second) // every one so far expired
			if err := st.CreateDashboardSession(ctx, sess("later", "t4", later), 3, 10); err != nil {
				t.Fatalf("after expiry: %v", err)
			}
			for _, h := range []string{"t1-1", "t1-3", "t2-1", "t3-0"} {
				if _, err := st.DashboardSession(ctx, h, t0); !errors.Is(err, ErrNotFound) {
					t.Errorf("expired session %s not swept: %v", h, err)
				}
			}
			if err := st.DeleteDashboardSession(ctx, "later"); err != nil {
				t.Fatal(err)
			}
			if _, err := st.DashboardSession(ctx, "later", later); !errors.Is(err, ErrNotFound) {
				t.Errorf("deleted session: %v", err)
			}
			if err := st.DeleteDashboardSession(ctx, "later"); err != nil {
				t.Errorf("deleting none: %v", err)
			}
		})
	}
}
