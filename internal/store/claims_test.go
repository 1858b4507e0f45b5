package store

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// twoHandles opens one fresh database of each kind twice, as two api
// processes do.
func twoHandles(t *testing.T) map[string][2]Store {
	t.Helper()
	ctx := context.Background()
	out := map[string][2]Store{}
	path := filepath.Join(t.TempDir(), "warren.db")
	var lite [2]Store
	for i := range lite {
		s, err := OpenSQLite(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		lite[i] = s
	}
	out["sqlite"] = lite
	dsn, ok := freshPostgres(t)
	if !ok {
		return out
	}
	var pg [2]Store
	for i := range pg {
		s, err := OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		pg[i] = s
	}
	out["postgres"] = pg
	return out
}

func TestClaimsHoldTheLimitAcrossHandles(t *testing.T) {
	for name, h := range twoHandles(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			for _, team := range []string{"team1", "team2"} {
				if err := h[0].CreateTeam(ctx, Team{ID: team, Name: team, CreatedAt: t0}); err != nil {
					t.Fatal(err)
				}
			}
			// One sandbox runs already; others are gone or paused.
			for id, state := range map[string]SandboxState{"run1": StateRunning, "dead1": StateKilled, "paused1": StatePaused} {
				sb := sandbox(id, t0, nil)
				sb.State = state
				if err := h[0].CreateSandbox(ctx, sb); err != nil {
					t.Fatal(err)
				}
			}
			const limit, tries = 4, 24
			expires := time.Now().Add(time.Minute)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var claims []string
			over := 0
			start := make(chan struct{})
			for i := range tries {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					id, err := h[i%2].ClaimSandbox(ctx, "team1", limit, expires)
					mu.Lock()
					defer mu.Unlock()
					var le *LimitError
					switch {
					case err == nil:
						claims = append(claims, id)
					case errors.As(err, &le) && errors.Is(err, ErrLimit) && le.Have == limit:
						over++
					default:
						t.Error(err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(claims) != limit-1 || over != tries-(limit-1) {
				t.Fatalf("%d claims at once, limit %d with one running: %d taken, %d refused", tries, limit, len(claims), over)
			}
			// Another team's count is its own; an unknown or empty team
			// has none.
			if _, err := h[1].ClaimSandbox(ctx, "team2", 1, expires); err != nil {
				t.Errorf("another team: %v", err)
			}
			for _, team := range []string{"", "nobody"} {
				if _, err := h[1].ClaimSandbox(ctx, team, 100, expires); !errors.Is(err, ErrNotFound) {
					t.Errorf("team %q: %v", team, err)
				}
			}
			// A released claim frees its place; an expired one is not
			// counted.
			if err := h[1].ReleaseClaim(ctx, claims[0]); err != nil {
				t.Fatal(err)
			}
			if err := h[1].ReleaseClaim(ctx, claims[0]); err != nil {
				t.Errorf("releasing twice: %v", err)
			}
			if _, err := h[0].ClaimSandbox(ctx, "team1", limit, time.Now().Add(-time.Second)); err != nil {
				t.Fatalf("after a release: %v", err)
			}
			if _, err := h[0].ClaimSandbox(ctx, "team1", limit, expires); err != nil {
				t.Errorf("beside an expired claim: %v", err)
			}
			if _, err := h[1].ClaimSandbox(ctx, "team1", limit, expires); !errors.Is(err, ErrLimit) {
				t.Errorf("at the limit again: %v", err)
			}
		})
	}
}
