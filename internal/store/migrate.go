package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
	"github.com/warren-sandbox/warren/internal/poll"
	"golang.org/x/sys/unix"
)

//go:embed migrations/*.sql
var embeddedMigrations embed.FS

// migrationLockID is the PostgreSQL advisory lock key held while the
// schema is migrated. The runner before goose took the same key, so an
// older and a newer warren starting together on one database still
// exclude each other.
const migrationLockID = 7261

// migrationLockSuffix names the file beside a SQLite database that is
// locked while it is migrated.
const migrationLockSuffix = ".migrate-lock"

// legacyVersionTable is where the runner before goose recorded the
// versions it applied.
const legacyVersionTable = "schema_migrations"

func (d dialect) goose() goose.Dialect {
	if d == postgresDialect {
		return goose.DialectPostgres
	}
	return goose.DialectSQLite3
}

// migrateEmbedded applies the migrations built into the binary: the SQL
// files and the Go migrations of dialect d.
func migrateEmbedded(ctx context.Context, db *sql.DB, d dialect, locker lock.SessionLocker) error {
	files, err := fs.Sub(embeddedMigrations, "migrations")
	if err != nil {
		return err
	}
	return migrate(ctx, db, d, files, locker, goMigrations(d)...)
}

// goMigrations are the migrations whose SQL differs between the two
// databases (triggers), numbered in the sequence of migrations/*.sql.
// Made afresh for each run: goose keeps state in them.
func goMigrations(d dialect) []*goose.Migration {
	return []*goose.Migration{sandboxCountsMigration(d)}
}

// migrate applies the migrations in files (at its root) and the Go
// migrations code that the database has not recorded, holding locker so
// that several processes opening one database at once apply each
// migration once. A new migration takes a number above every one before
// it: goose refuses a file numbered below the version a database already
// has (the gaps in the numbering are branches' numbers that were
// renumbered at merge), and a file and a Go migration of one number.
func migrate(ctx context.Context, db *sql.DB, d dialect, files fs.FS, locker lock.SessionLocker, code ...*goose.Migration) error {
	if err := prepareVersionTable(ctx, db, d); err != nil {
		return fmt.Errorf("store: migration versions: %w", err)
	}
	p, err := goose.NewProvider(d.goose(), db, files,
		goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true), goose.WithGoMigrations(code...))
	if err != nil {
		return fmt.Errorf("store: migrations: %w", err)
	}
	results, err := p.Up(ctx)
	for _, r := range results {
		if r.Source.Type == goose.TypeGo {
			slog.Info("store: applied migration", "version", r.Source.Version, "go", true)
			continue
		}
		slog.Info("store: applied migration", "version", r.Source.Version, "file", path.Base(r.Source.Path))
	}
	if err != nil {
		return fmt.Errorf("store: migrating: %w", err)
	}
	return nil
}

// prepareVersionTable creates goose's version table if the database has
// none, in one transaction under the migration lock (PostgreSQL's
// advisory lock; SQLite's BEGIN IMMEDIATE write lock), so that
// concurrent opens never race to create it.
//
// A database the runner before goose migrated records its versions in
// schema_migrations; they are copied into the new table so that those
// migrations are not run again. schema_migrations is left as it was and
// never written again: an older warren started on the database (a
// rollback, or one node of several sharing PostgreSQL upgraded first)
// then still finds its migrations applied instead of re-running 0001
// against the existing tables.
func prepareVersionTable(ctx context.Context, db *sql.DB, d dialect) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if d == postgresDialect {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLockID)); err != nil {
			return err
		}
	}
	if exists, err := tableExists(ctx, tx, d, goose.DefaultTablename); err != nil || exists {
		return err
	}
	versions, err := legacyVersions(ctx, tx, d)
	if err != nil {
		return err
	}
	st, err := database.NewStore(d.goose(), goose.DefaultTablename)
	if err != nil {
		return err
	}
	if err := st.CreateVersionTable(ctx, tx); err != nil {
		return err
	}
	// Version 0 is goose's mark of an initialised table.
	for _, v := range append([]int64{0}, versions...) {
		if err := st.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// legacyVersions lists the versions schema_migrations records, in order;
// none if the table does not exist.
func legacyVersions(ctx context.Context, tx *sql.Tx, d dialect) ([]int64, error) {
	exists, err := tableExists(ctx, tx, d, legacyVersionTable)
	if err != nil || !exists {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, "SELECT version FROM "+legacyVersionTable+" ORDER BY version")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// tableExists tells whether the table is in the database (PostgreSQL:
// found through the search path, where goose creates its own).
func tableExists(ctx context.Context, tx *sql.Tx, d dialect, table string) (bool, error) {
	query := "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?"
	if d == postgresDialect {
		query = "SELECT to_regclass($1) IS NOT NULL"
	}
	var exists bool
	err := tx.QueryRowContext(ctx, query, table).Scan(&exists)
	return exists, err
}

// postgresLocker is goose's session-level advisory lock on the migration
// key, tried every second for up to five minutes.
func postgresLocker() (lock.SessionLocker, error) {
	return lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID), lock.WithLockTimeout(1, 300))
}

// fileLocker is a goose session locker for SQLite, which has no advisory
// locks: an exclusive flock on a file beside the database. (Not on the
// database file itself: closing any descriptor of it would drop the
// POSIX locks SQLite holds in this process.)
type fileLocker struct {
	path string
	held *os.File
}

// lockPoll is how often a waiting fileLocker tries again.
const lockPoll = 20 * time.Millisecond

func (l *fileLocker) SessionLock(ctx context.Context, _ *sql.Conn) error {
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("migration lock: %w", err)
	}
	err = poll.Until(ctx, lockPoll, func(context.Context) (bool, error) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		f.Close()
		return fmt.Errorf("migration lock %s: %w", l.path, err)
	}
	l.held = f
	return nil
}

// SessionUnlock closes the lock file, which releases the flock.
func (l *fileLocker) SessionUnlock(context.Context, *sql.Conn) error {
	if l.held == nil {
		return errors.New("migration lock: not held")
	}
	f := l.held
	l.held = nil
	return f.Close()
}
