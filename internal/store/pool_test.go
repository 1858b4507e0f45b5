package store

import (
	"context"
	"sync"
	"testing"
)

// Statements run at once keep their connections for the next ones: with
// database/sql's default of 2 idle connections, every statement beyond
// the second that ran at once closed its connection at its end, and the
// next one opened a new one (a PostgreSQL backend started per
// statement under load; test/scale).
func TestConnectionsOutliveTheirStatements(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		if err := s.CreateTeam(ctx, Team{ID: "team1", Name: "t", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		db := s.(*SQL).db
		const workers, each = 16, 20
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					if _, err := s.GetTeam(ctx, "team1"); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if st := db.Stats(); st.MaxIdleClosed > 0 {
			t.Errorf("%d connections closed at their statement's end, %d open (%d statements, %d at once)", st.MaxIdleClosed, st.OpenConnections, workers*each, workers)
		}
	})
}

// A burst of statements past the bound waits for a connection: none
// fails and PostgreSQL never sees more than maxPostgresConns of this
// process's (without the bound, 96 statements at once opened 96
// connections, and past max_connections PostgreSQL refused them).
func TestPostgresConnectionsAreBounded(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		db := s.(*SQL).db
		if s.(*SQL).d != postgresDialect {
			return // SQLite has its own bound (one writer)
		}
		ctx := context.Background()
		const burst = 3 * maxPostgresConns
		var wg sync.WaitGroup
		errs := make(chan error, burst)
		for range burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := db.ExecContext(ctx, "SELECT pg_sleep(0.2)")
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if st := db.Stats(); st.MaxOpenConnections != maxPostgresConns || st.OpenConnections > maxPostgresConns || st.WaitCount == 0 {
			t.Errorf("pool after %d statements at once: %d open (bound %d), %d waited", burst, st.OpenConnections, st.MaxOpenConnections, st.WaitCount)
		}
	})
}
