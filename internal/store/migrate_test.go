package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/pressly/goose/v3/lock"
)

// blankDatabase is an empty database of one kind, opened without
// migrating, with what the test needs to migrate or open it.
type blankDatabase struct {
	db     *sql.DB
	d      dialect
	url    string // for Open
	locker func() lock.SessionLocker
}

// blankDatabases gives an empty database of each kind reachable.
func blankDatabases(t *testing.T) map[string]blankDatabase {
	t.Helper()
	out := map[string]blankDatabase{}
	path := filepath.Join(t.TempDir(), "warren.db")
	lite, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lite.Close() })
	out["sqlite"] = blankDatabase{db: lite, d: sqliteDialect, url: path,
		locker: func() lock.SessionLocker { return &fileLocker{path: path + migrationLockSuffix} }}

	dsn, ok := freshPostgres(t)
	if !ok {
		return out
	}
	pg, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	out["postgres"] = blankDatabase{db: pg, d: postgresDialect, url: dsn,
		locker: func() lock.SessionLocker {
			l, err := postgresLocker()
			if err != nil {
				t.Fatal(err)
			}
			return l
		}}
	return out
}

// open opens the database with the store's own Open.
func (b blankDatabase) open(ctx context.Context) (*SQL, error) {
	if b.d == postgresDialect {
		return OpenPostgres(ctx, b.url)
	}
	return OpenSQLite(ctx, b.url)
}

// embeddedVersions are the versions of the migrations built in: the SQL
// files' and the Go migrations' (the same numbers on both databases), in
// order.
func embeddedVersions(t *testing.T) []int64 {
	t.Helper()
	out := fileVersions(t)
	for _, m := range goMigrations(sqliteDialect) {
		out = append(out, m.Version)
	}
	slices.Sort(out)
	return out
}

// fileVersions are the versions of the SQL files built in, in order.
func fileVersions(t *testing.T) []int64 {
	t.Helper()
	names, err := fs.Glob(embeddedMigrations, "migrations/*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("no migrations embedded: %v", err)
	}
	var out []int64
	for _, name := range names {
		out = append(out, fileVersion(t, name))
	}
	return out
}

// fileVersion is the version of the migration file name.
func fileVersion(t *testing.T, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(strings.SplitN(filepath.Base(name), "_", 2)[0], 10, 64)
	if err != nil {
		t.Fatalf("migration %s: %v", name, err)
	}
	return v
}

// migrateLikeOldRunner does what the runner before goose did: in one
// transaction, apply the embedded SQL files up to version upTo, each
// split on ';', and record each in schema_migrations. (It knew no Go
// migrations: the first came after it.)
func migrateLikeOldRunner(t *testing.T, db *sql.DB, d dialect, upTo int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	names, _ := fs.Glob(embeddedMigrations, "migrations/*.sql")
	for _, name := range names {
		version := fileVersion(t, name)
		if version > upTo {
			break
		}
		body, err := embeddedMigrations.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, stmt := range strings.Split(string(body), ";") {
			if strings.TrimSpace(stmt) == "" {
				continue
			}
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("old runner, %s: %v", name, err)
			}
		}
		insert := "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)"
		if d == postgresDialect {
			insert = "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)"
		}
		if _, err := tx.ExecContext(ctx, insert, version, time.Now().UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// versionsIn lists a version table's versions in the order recorded.
func versionsIn(t *testing.T, db *sql.DB, query string) []int64 {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func gooseVersions(t *testing.T, db *sql.DB) []int64 {
	return versionsIn(t, db, "SELECT version_id FROM goose_db_version ORDER BY id")
}

// withMigration is the embedded migrations plus one more file.
func withMigration(t *testing.T, name, body string) fs.FS {
	t.Helper()
	files, err := fs.Sub(embeddedMigrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	out := fstest.MapFS{name: {Data: []byte(body)}}
	err = fs.WalkDir(files, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		data, err := fs.ReadFile(files, p)
		out[p] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestOpenAdoptsOldRunnerVersions(t *testing.T) {
	all := embeddedVersions(t)
	last := all[len(all)-1]
	// Versions have gaps (each issue reserves its number), so the one
	// before the last is the embedded one before it.
	upTos := []int64{last}
	if len(all) > 1 {
		upTos = []int64{all[len(all)-2], last}
	}
	for _, upTo := range upTos {
		t.Run(fmt.Sprintf("old runner applied 1..%d", upTo), func(t *testing.T) {
			for kind, b := range blankDatabases(t) {
				t.Run(kind, func(t *testing.T) { testAdoptOldRunner(t, b, upTo, last) })
			}
		})
	}
}

func testAdoptOldRunner(t *testing.T, b blankDatabase, upTo, last int64) {
	ctx := context.Background()
	migrateLikeOldRunner(t, b.db, b.d, upTo)
	s := &SQL{db: b.db, d: b.d}
	if err := s.CreateTeam(ctx, Team{ID: "team1", Name: "before", CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}

	// A migration added after the switch: it applies, and the old
	// runner's ones (CREATE TABLE without IF NOT EXISTS) are not re-run.
	next := last + 1
	files := withMigration(t, fmt.Sprintf("%04d_team_note.sql", next),
		"-- +goose Up\nALTER TABLE teams ADD COLUMN note TEXT NOT NULL DEFAULT 'none';\n")
	if err := migrate(ctx, b.db, b.d, files, b.locker(), goMigrations(b.d)...); err != nil {
		t.Fatalf("migrating a database of the old runner: %v", err)
	}

	if got, err := s.GetTeam(ctx, "team1"); err != nil || got.Name != "before" {
		t.Errorf("team written before the upgrade: %+v %v", got, err)
	}
	var note string
	if err := b.db.QueryRow("SELECT note FROM teams WHERE id = 'team1'").Scan(&note); err != nil || note != "none" {
		t.Errorf("later migration: note = %q, %v", note, err)
	}
	// The last built-in migration (paused_at) is in place either way.
	sb := sandbox("sb1", t0, nil)
	sb.State, sb.PausedAt = StatePaused, t0.Add(time.Minute)
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, "sb1"); err != nil || !got.PausedAt.Equal(sb.PausedAt) {
		t.Errorf("paused_at after upgrade: %v %v", got.PausedAt, err)
	}

	// Versions are reserved per issue, so the embedded ones may skip a
	// number until every branch has landed.
	want := append(append([]int64{0}, embeddedVersions(t)...), next)
	if got := gooseVersions(t, b.db); !reflect.DeepEqual(got, want) {
		t.Errorf("goose versions = %v, want %v (each once)", got, want)
	}
	var legacy []int64
	for _, v := range fileVersions(t) {
		if v <= upTo {
			legacy = append(legacy, v)
		}
	}
	if got := versionsIn(t, b.db, "SELECT version FROM schema_migrations ORDER BY version"); !reflect.DeepEqual(got, legacy) {
		t.Errorf("schema_migrations = %v, want it left as the old runner wrote it: %v", got, legacy)
	}

	// The store's own Open (which knows no migration `next`) opens the
	// upgraded database and applies nothing again.
	again, err := b.open(ctx)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	again.Close()
	if got := gooseVersions(t, b.db); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopening, goose versions = %v, want %v", got, want)
	}
}

func TestFreshDatabaseGetsEveryMigration(t *testing.T) {
	want := append([]int64{0}, embeddedVersions(t)...)
	for kind, b := range blankDatabases(t) {
		t.Run(kind, func(t *testing.T) {
			s, err := b.open(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := gooseVersions(t, b.db); !reflect.DeepEqual(got, want) {
				t.Errorf("goose versions = %v, want %v", got, want)
			}
			tx, err := b.db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if legacy, err := tableExists(context.Background(), tx, b.d, legacyVersionTable); err != nil || legacy {
				t.Errorf("a fresh database has %s (%v): only goose's table is written now", legacyVersionTable, err)
			}
		})
	}
}

func TestConcurrentOpensMigrateOnce(t *testing.T) {
	want := append([]int64{0}, embeddedVersions(t)...)
	for kind, b := range blankDatabases(t) {
		t.Run(kind, func(t *testing.T) {
			const opens = 4
			var wg sync.WaitGroup
			errs := make([]error, opens)
			for i := range opens {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					s, err := b.open(ctx)
					if err == nil {
						s.Close()
					}
					errs[i] = err
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("open #%d: %v", i+1, err)
				}
			}
			if got := gooseVersions(t, b.db); !reflect.DeepEqual(got, want) {
				t.Errorf("goose versions = %v, want %v (each once)", got, want)
			}
		})
	}
}

// migrationsUpTo is the embedded migrations up to version upTo.
func migrationsUpTo(t *testing.T, upTo int64) fs.FS {
	t.Helper()
	files, err := fs.Sub(embeddedMigrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	out := fstest.MapFS{}
	names, _ := fs.Glob(files, "*.sql")
	for _, p := range names {
		var v int64
		fmt.Sscanf(p, "%d_", &v)
		if v > upTo {
			continue
		}
		data, err := fs.ReadFile(files, p)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = &fstest.MapFile{Data: data}
	}
	return out
}

// TestNamesMoveIntoTheirTeams: names written before 0010 (one global
// name space) are their template's team's after it.
func TestNamesMoveIntoTheirTeams(t *testing.T) {
	for kind, b := range blankDatabases(t) {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			if err := migrate(ctx, b.db, b.d, migrationsUpTo(t, 9), b.locker()); err != nil {
				t.Fatal(err)
			}
			s := &SQL{db: b.db, d: b.d}
			for _, q := range []string{
				"INSERT INTO templates (id, team_id, names, public, cpu_count, memory_mb, disk_size_mb, created_at, updated_at, last_spawned_at, spawn_count, build_count, created_by) " +
					"VALUES ('tplA', 'teamA', '[\"app\",\"web\"]', 0, 1, 512, 0, 0, 0, 0, 0, 0, '')",
				"INSERT INTO templates (id, team_id, names, public, cpu_count, memory_mb, disk_size_mb, created_at, updated_at, last_spawned_at, spawn_count, build_count, created_by) " +
					"VALUES ('tplB', 'teamB', '[\"db\"]', 0, 1, 512, 0, 0, 0, 0, 0, 0, '')",
				"INSERT INTO template_names (name, template_id) VALUES ('app', 'tplA'), ('web', 'tplA'), ('db', 'tplB')",
			} {
				if _, err := b.db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			if err := migrate(ctx, b.db, b.d, migrationsUpTo(t, 10), b.locker()); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct{ team, name, want string }{
				{"teamA", "app", "tplA"}, {"teamA", "web", "tplA"}, {"teamB", "db", "tplB"}, {"teamB", "app", ""}, {"teamA", "db", ""},
			} {
				got, err := s.TemplateByName(ctx, c.team, c.name)
				if c.want == "" {
					if !errors.Is(err, ErrNotFound) {
						t.Errorf("%s/%s: %+v %v, want not found", c.team, c.name, got.ID, err)
					}
					continue
				}
				if err != nil || got.ID != c.want {
					t.Errorf("%s/%s = %q %v, want %s", c.team, c.name, got.ID, err, c.want)
				}
			}
			// teamB may now have an app of its own.
			if err := s.CreateTemplate(ctx, Template{ID: "tplB2", TeamID: "teamB", Names: []string{"app"}}); err != nil {
				t.Errorf("teamB's own app: %v", err)
			}
		})
	}
}

// TestKeyIDsBecomeUUIDs: migration 0019 turns each 16-hex-digit key ID
// into a UUID that holds all its digits (so two old IDs never meet), and
// leaves the key otherwise as it was.
func TestKeyIDsBecomeUUIDs(t *testing.T) {
	for kind, b := range blankDatabases(t) {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			if err := migrate(ctx, b.db, b.d, migrationsUpTo(t, 18), b.locker()); err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{
				"INSERT INTO teams (id, name, created_at) VALUES ('default', 'default', 0)",
				"INSERT INTO keys (id, team_id, kind, name, hash, mask, created_at) VALUES ('0123456789abcdef', 'default', 'api_key', 'old', 'h1', 'e2b_0123…wxyz', 5)",
				"INSERT INTO keys (id, team_id, kind, name, hash, mask, created_at) VALUES ('0123456789abcdee', 'default', 'access_token', 'old2', 'h2', 'sk_e2b_0…wxyz', 6)",
			} {
				if _, err := b.db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			if err := migrate(ctx, b.db, b.d, migrationsUpTo(t, 19), b.locker()); err != nil {
				t.Fatal(err)
			}
			s := &SQL{db: b.db, d: b.d}
			keys, err := s.ListKeys(ctx, "default")
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"01234567-89ab-4cde-8f00-000000000000", "01234567-89ab-4cde-8e00-000000000000"}
			if len(keys) != 2 || keys[0].ID != want[0] || keys[1].ID != want[1] {
				t.Fatalf("keys after 0019: %+v, want IDs %v", keys, want)
			}
			if k := keys[0]; k.Name != "old" || k.Hash != "h1" || k.Mask != "e2b_0123…wxyz" || k.ValueLength != 0 || k.Kind != KindAPIKey {
				t.Errorf("key changed beyond its ID: %+v", k)
			}
		})
	}
}
