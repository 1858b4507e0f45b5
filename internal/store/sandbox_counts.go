package store

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
)

// Migration 0031: how many sandboxes each team has in each state on each
// node, kept by the database in the transaction of every write to
// sandboxes, so that X-Total-Running (CountSandboxes, on every page of
// GET /v2/sandboxes) reads about one row per node instead of an index
// entry per sandbox: 10,000 entries for a team with 10,000 running
// (docs/scale.md, "Round two").
//
// A row exists only while its count is above zero. The counts are kept
// by triggers, not by the Go code that writes sandboxes, so that no write
// (this package's, an operator's SQL, a future statement) can make them
// drift (on PostgreSQL a TRUNCATE of sandboxes empties the counts too);
// their SQL differs between the databases, hence a Go migration.
// The table is filled from the rows there, after the triggers are in
// place and with writers to sandboxes locked out (PostgreSQL), so that no
// write falls between the two.
//
// Contention: every create adds one to its (team, running, node) row, and
// every pause, resume, kill, takeover and delete moves one between two
// rows, each row locked until the commit. On PostgreSQL the triggers are
// deferred to the commit, so the row is locked only for the commit
// itself, and the creates add nothing to the order they already have:
// each of them holds the one-row sandbox_route_seq from its statement to
// its commit (routes.go), so no two creates of the cluster commit at
// once anyway, whatever their team or node. A team's creates on different
// nodes take different rows. The other writes (pause, resume, delete)
// wait on a counter row only for another write's commit of the same
// team, state and node. Deferring also orders the locks: a transaction
// takes the route sequence before any counter row, and an update takes
// its two rows in key order, so that a pause and a resume crossing on one
// node cannot deadlock. (This relies on each transaction writing one
// sandbox, as every write in this package does; a statement writing many
// could deadlock with another such, which PostgreSQL breaks by failing
// one, never by miscounting.) SQLite's write transactions are exclusive:
// its triggers run in statement order.
func sandboxCountsMigration(d dialect) *goose.Migration {
	stmts := sandboxCountsSQLite
	if d == postgresDialect {
		stmts = sandboxCountsPostgres
	}
	return goose.NewGoMigration(31, &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
		for _, stmt := range stmts {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("sandbox counts: %w", err)
			}
		}
		return nil
	}}, nil)
}

const sandboxCountsTable = `CREATE TABLE sandbox_counts (
    team_id  TEXT NOT NULL,
    state    TEXT NOT NULL,
    node     TEXT NOT NULL,
    n        BIGINT NOT NULL,
    PRIMARY KEY (team_id, state, node)
)`

const sandboxCountsFill = `INSERT INTO sandbox_counts (team_id, state, node, n)
    SELECT team_id, state, node, COUNT(*) FROM sandboxes GROUP BY team_id, state, node`

var sandboxCountsPostgres = []string{
	// Writers to sandboxes wait from here to the migration's commit.
	`LOCK TABLE sandboxes IN SHARE ROW EXCLUSIVE MODE`,
	sandboxCountsTable,
	// Adds d to a count; the row goes when it reaches zero.
	`CREATE FUNCTION sandbox_counts_add(t TEXT, s TEXT, nd TEXT, d BIGINT) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sandbox_counts AS c (team_id, state, node, n) VALUES (t, s, nd, d)
        ON CONFLICT (team_id, state, node) DO UPDATE SET n = c.n + EXCLUDED.n;
    IF d < 0 THEN
        DELETE FROM sandbox_counts WHERE team_id = t AND state = s AND node = nd AND n = 0;
    END IF;
END $$`,
	// An update moves one from the old key to the new, taking the two
	// rows in key order.
	`CREATE FUNCTION sandbox_counts_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- A create's, the most frequent: one statement, no call.
        INSERT INTO sandbox_counts AS c (team_id, state, node, n) VALUES (NEW.team_id, NEW.state, NEW.node, 1)
            ON CONFLICT (team_id, state, node) DO UPDATE SET n = c.n + 1;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM sandbox_counts_add(OLD.team_id, OLD.state, OLD.node, -1);
    ELSIF (OLD.team_id, OLD.state, OLD.node) < (NEW.team_id, NEW.state, NEW.node) THEN
        PERFORM sandbox_counts_add(OLD.team_id, OLD.state, OLD.node, -1);
        PERFORM sandbox_counts_add(NEW.team_id, NEW.state, NEW.node, 1);
    ELSE
        PERFORM sandbox_counts_add(NEW.team_id, NEW.state, NEW.node, 1);
        PERFORM sandbox_counts_add(OLD.team_id, OLD.state, OLD.node, -1);
    END IF;
    RETURN NULL;
END $$`,
	`CREATE CONSTRAINT TRIGGER sandbox_counts_insert AFTER INSERT ON sandboxes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION sandbox_counts_follow()`,
	`CREATE CONSTRAINT TRIGGER sandbox_counts_update AFTER UPDATE OF team_id, state, node ON sandboxes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.team_id IS DISTINCT FROM NEW.team_id OR OLD.state IS DISTINCT FROM NEW.state OR OLD.node IS DISTINCT FROM NEW.node)
    EXECUTE FUNCTION sandbox_counts_follow()`,
	`CREATE CONSTRAINT TRIGGER sandbox_counts_delete AFTER DELETE ON sandboxes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION sandbox_counts_follow()`,
	// TRUNCATE fires no row trigger (SQLite has none).
	`CREATE FUNCTION sandbox_counts_clear() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM sandbox_counts;
    RETURN NULL;
END $$`,
	`CREATE TRIGGER sandbox_counts_truncate AFTER TRUNCATE ON sandboxes
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_counts_clear()`,
	sandboxCountsFill,
}

var sandboxCountsSQLite = []string{
	sandboxCountsTable,
	`CREATE TRIGGER sandbox_counts_insert AFTER INSERT ON sandboxes BEGIN
    INSERT INTO sandbox_counts (team_id, state, node, n) VALUES (NEW.team_id, NEW.state, NEW.node, 1)
        ON CONFLICT (team_id, state, node) DO UPDATE SET n = n + 1;
END`,
	`CREATE TRIGGER sandbox_counts_update AFTER UPDATE OF team_id, state, node ON sandboxes
    WHEN OLD.team_id IS NOT NEW.team_id OR OLD.state IS NOT NEW.state OR OLD.node IS NOT NEW.node
BEGIN
    INSERT INTO sandbox_counts (team_id, state, node, n) VALUES (OLD.team_id, OLD.state, OLD.node, -1)
        ON CONFLICT (team_id, state, node) DO UPDATE SET n = n - 1;
    DELETE FROM sandbox_counts WHERE team_id = OLD.team_id AND state = OLD.state AND node = OLD.node AND n = 0;
    INSERT INTO sandbox_counts (team_id, state, node, n) VALUES (NEW.team_id, NEW.state, NEW.node, 1)
        ON CONFLICT (team_id, state, node) DO UPDATE SET n = n + 1;
END`,
	`CREATE TRIGGER sandbox_counts_delete AFTER DELETE ON sandboxes BEGIN
    INSERT INTO sandbox_counts (team_id, state, node, n) VALUES (OLD.team_id, OLD.state, OLD.node, -1)
        ON CONFLICT (team_id, state, node) DO UPDATE SET n = n - 1;
    DELETE FROM sandbox_counts WHERE team_id = OLD.team_id AND state = OLD.state AND node = OLD.node AND n = 0;
END`,
	sandboxCountsFill,
}
