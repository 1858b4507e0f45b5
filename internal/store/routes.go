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

// takeRouteSeq takes the next route sequence value in tx, which holds
// the sequence's row lock until it ends (PostgreSQL; SQLite's write
// transactions are exclusive): values commit in order. Take it as late
// in tx as can be: every other route change waits for tx's end.
func (s *SQL) takeRouteSeq(ctx context.Context, tx *sql.Tx) (int64, error) {
	var seq int64
	err := tx.QueryRowContext(ctx, takeRouteSeqSQL).Scan(&seq)
	return seq, err
}

const takeRouteSeqSQL = "UPDATE sandbox_route_seq SET seq = seq + 1 WHERE id = 1 RETURNING seq"

// routeSeqInsert is PostgreSQL's insert of a sandbox (sandboxColumns,
// their placeholders marks) that takes the next route sequence value in
// the same statement.
func routeSeqInsert(marks string) string {
	return "WITH seq AS (" + takeRouteSeqSQL + ") INSERT INTO sandboxes (" + sandboxColumns + ", route_seq) VALUES (" + marks + ", (SELECT seq FROM seq))"
}

// nextRouteSeq takes the next route sequence value for the sandbox id in
// tx and gives it to the sandbox (takeRouteSeq).
func (s *SQL) nextRouteSeq(ctx context.Context, tx *sql.Tx, id string) error {
	if s.d == postgresDialect {
		_, err := tx.ExecContext(ctx, "WITH seq AS ("+takeRouteSeqSQL+") UPDATE sandboxes SET route_seq = (SELECT seq FROM seq) WHERE id = $1", id)
		return err
	}
	seq, err := s.takeRouteSeq(ctx, tx)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.q("UPDATE sandboxes SET route_seq = ? WHERE id = ?"), seq, id)
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
