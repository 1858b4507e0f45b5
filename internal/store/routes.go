package store

import (
	"context"
	"database/sql"
)

// SandboxRoute is what routes a signed URL to a sandbox: its envd access
// token, and whether the proxy reaches it (State, AutoResume).
type SandboxRoute struct {
	ID              string
	EnvdAccessToken string
	State           SandboxState
	AutoResume      bool
}

// RouteStore lets an api process keep the envd tokens of the cluster's
// sandboxes in memory, in step with the store, reading only what changed.
type RouteStore interface {
	// SandboxRoutes returns the routes of the sandboxes whose routing
	// changed (created; State, AutoResume or EnvdAccessToken updated)
	// after seq, a value it returned before, and the value to pass next.
	// With seq 0 it returns the routes of every running or paused
	// sandbox. Every change is seen once its write committed, in commit
	// order. Deleted records are not reported.
	SandboxRoutes(ctx context.Context, seq int64) (routes []SandboxRoute, next int64, err error)
}

// nextRouteSeq records in tx that sandbox id's routing changed.
//
// PostgreSQL: its route_seq becomes tx's transaction ID, which takes no
// lock shared with other writers (a one-row counter's row lock, held to
// commit, made every create of the cluster wait for the one before it:
// docs/scale.md). SandboxRoutes reads a change once every transaction
// with a lower ID has ended (the snapshot's xmin), so that none is
// missed whatever order they commit in.
//
// SQLite: the next value of the one-row sandbox_route_seq (its write
// transactions are exclusive: values commit in order).
func (s *SQL) nextRouteSeq(ctx context.Context, tx *sql.Tx, id string) error {
	if s.d == postgresDialect {
		_, err := tx.ExecContext(ctx, "UPDATE sandboxes SET route_seq = pg_current_xact_id()::text::bigint WHERE id = $1", id)
		return err
	}
	var seq int64
	if err := tx.QueryRowContext(ctx, "UPDATE sandbox_route_seq SET seq = seq + 1 WHERE id = 1 RETURNING seq").Scan(&seq); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, s.q("UPDATE sandboxes SET route_seq = ? WHERE id = ?"), seq, id)
	return err
}

// routeChanged says whether an update changes how sb is routed.
func routeChanged(before, after *Sandbox) bool {
	return before.State != after.State || before.AutoResume != after.AutoResume || before.EnvdAccessToken != after.EnvdAccessToken
}

func scanRoute(row interface{ Scan(...any) error }) (r SandboxRoute, seq int64, err error) {
	var state string
	var autoResume int
	err = row.Scan(&r.ID, &r.EnvdAccessToken, &state, &autoResume, &seq)
	r.State, r.AutoResume = SandboxState(state), autoResume != 0
	return r, seq, err
}

func (s *SQL) SandboxRoutes(ctx context.Context, seq int64) ([]SandboxRoute, int64, error) {
	if s.d == postgresDialect {
		return s.sandboxRoutesByXID(ctx, seq)
	}
	const cols = "SELECT id, envd_access_token, state, auto_resume, route_seq FROM sandboxes"
	var rows *sql.Rows
	var err error
	next := seq
	if seq <= 0 {
		// The sequence first: every change up to it has committed, so
		// the read after sees it; later ones are read again next time.
		if err := s.db.QueryRowContext(ctx, "SELECT seq FROM sandbox_route_seq WHERE id = 1").Scan(&next); err != nil {
			return nil, 0, err
		}
		rows, err = s.db.QueryContext(ctx, s.q(cols+" WHERE state IN (?, ?)"), string(StateRunning), string(StatePaused))
	} else {
		rows, err = s.db.QueryContext(ctx, s.q(cols+" WHERE route_seq > ? ORDER BY route_seq"), seq)
	}
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []SandboxRoute
	for rows.Next() {
		r, rs, err := scanRoute(rows)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, r)
		if seq > 0 && rs > next {
			next = rs
		}
	}
	return out, next, rows.Err()
}

// sandboxRoutesByXID is SandboxRoutes on PostgreSQL, where route_seq is
// the ID of the transaction that made the change (nextRouteSeq). The
// value returned is the oldest transaction still running (the xmin of a
// snapshot taken first): every transaction below it has ended, so the
// read after sees all of their changes, and the next read takes the
// changes from it on. Each change is read once (once its transaction and
// every older one have ended); a long write transaction delays the
// changes after it until it ends.
func (s *SQL) sandboxRoutesByXID(ctx context.Context, seq int64) ([]SandboxRoute, int64, error) {
	const cols = "SELECT id, envd_access_token, state, auto_resume, route_seq FROM sandboxes"
	var horizon int64
	if err := s.db.QueryRowContext(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").Scan(&horizon); err != nil {
		return nil, 0, err
	}
	var rows *sql.Rows
	var err error
	if seq <= 0 {
		rows, err = s.db.QueryContext(ctx, cols+" WHERE state IN ($1, $2)", string(StateRunning), string(StatePaused))
	} else {
		rows, err = s.db.QueryContext(ctx, cols+" WHERE route_seq >= $1 AND route_seq < $2 ORDER BY route_seq", seq, horizon)
	}
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []SandboxRoute
	for rows.Next() {
		r, _, err := scanRoute(rows)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, r)
	}
	return out, max(seq, horizon), rows.Err()
}
