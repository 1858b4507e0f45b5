package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"github.com/pressly/goose/v3/lock"
	"modernc.org/sqlite" // registers "sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

type dialect int

const (
	sqliteDialect dialect = iota
	postgresDialect
)

// SQL is the Store on SQLite or PostgreSQL.
type SQL struct {
	db *sql.DB
	d  dialect
}

var _ Store = (*SQL)(nil)

// OpenSQLite opens (creating if needed) the SQLite database at path, in
// WAL mode, and migrates it.
func OpenSQLite(ctx context.Context, path string) (*SQL, error) {
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		return nil, err
	}
	locker := &fileLocker{path: path + migrationLockSuffix}
	// The first connection to a new database switches it to WAL, and
	// SQLite answers SQLITE_BUSY at once, without waiting, to another
	// process's connection doing the same: connect under the lock.
	if err := locker.SessionLock(ctx, nil); err != nil {
		db.Close()
		return nil, err
	}
	err = db.PingContext(ctx)
	locker.SessionUnlock(ctx, nil)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: connecting: %w", err)
	}
	return open(ctx, db, sqliteDialect, locker)
}

// sqliteDSN is the modernc.org/sqlite data source of the database file
// at path.
func sqliteDSN(path string) string {
	// _txlock=immediate: a write transaction takes the write lock at BEGIN,
	// so read-modify-write transactions serialise instead of failing late.
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

// OpenPostgres connects to PostgreSQL (a pgx connection string or URL)
// and migrates the database.
func OpenPostgres(ctx context.Context, dsn string) (*SQL, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	locker, err := postgresLocker()
	if err != nil {
		db.Close()
		return nil, err
	}
	db.SetMaxOpenConns(maxPostgresConns)
	return open(ctx, db, postgresDialect, locker)
}

// Open picks the database by the form of url: "postgres://…" or
// "postgresql://…" for PostgreSQL, anything else is a SQLite file path.
func Open(ctx context.Context, url string) (*SQL, error) {
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		return OpenPostgres(ctx, url)
	}
	return OpenSQLite(ctx, strings.TrimPrefix(url, "sqlite://"))
}

// Connections kept open between uses: database/sql keeps 2 by default,
// and closes every other one when its statement ends, so that a process
// running more than 2 statements at once (an api under load, a node's
// heartbeat beside its sandboxes' writes) opened a connection for nearly
// each one: a PostgreSQL backend started, authenticated and dropped per
// statement (test/scale counted 1 new connection per create at 32 creates
// at once). Those past idleConns, or idle for idleConnTime, still close.
//
// And at most maxPostgresConns open at once: a burst of statements (500
// creates offered in a second, test/scale) waits for a connection instead
// of opening one each until PostgreSQL refuses ("too many clients",
// answered 500), and then refuses every process of the cluster, whose
// heartbeats stop. A cluster of N processes needs max_connections of at
// least 32·N plus PostgreSQL's reserved ones (docs/cluster.md). No
// statement of this package waits for a second connection while it holds
// one (a transaction's callbacks only change the record), so the bound
// cannot deadlock the pool.
const (
	idleConns        = 32
	idleConnTime     = 2 * time.Minute
	maxPostgresConns = 32
)

func open(ctx context.Context, db *sql.DB, d dialect, locker lock.SessionLocker) (*SQL, error) {
	db.SetMaxIdleConns(idleConns)
	db.SetConnMaxIdleTime(idleConnTime)
	s := &SQL{db: db, d: d}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: connecting: %w", err)
	}
	if err := migrateEmbedded(ctx, db, d, locker); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *SQL) Close() error { return s.db.Close() }

// q rewrites "?" placeholders as $1, $2… for PostgreSQL.
func (s *SQL) q(query string) string {
	if s.d != postgresDialect {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// pgUniqueViolation is PostgreSQL's SQLSTATE unique_violation.
const pgUniqueViolation = "23505"

// isUniqueViolation recognises both drivers' duplicate-key errors by
// their codes: SQLite's extended result codes for a UNIQUE or PRIMARY
// KEY constraint, PostgreSQL's SQLSTATE 23505.
func isUniqueViolation(err error) bool {
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		return lite.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || lite.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	}
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == pgUniqueViolation
}

func notFound(what, id string, err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: %s %s: %w", what, id, ErrNotFound)
	}
	return err
}

// Teams.

func (s *SQL) CreateTeam(ctx context.Context, t Team) error {
	_, err := s.db.ExecContext(ctx, s.q("INSERT INTO teams (id, name, created_at) VALUES (?, ?, ?)"), t.ID, t.Name, ms(t.CreatedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: team %s: %w", t.ID, ErrConflict)
	}
	return err
}

func (s *SQL) GetTeam(ctx context.Context, id string) (Team, error) {
	t, err := scanTeam(s.db.QueryRowContext(ctx, s.q("SELECT id, name, created_at FROM teams WHERE id = ?"), id))
	return t, notFound("team", id, err)
}

func (s *SQL) ListTeams(ctx context.Context) ([]Team, error) {
	return queryAll(ctx, s.db, "SELECT id, name, created_at FROM teams ORDER BY created_at, id", scanTeam)
}

func scanTeam(row interface{ Scan(...any) error }) (Team, error) {
	var t Team
	var created int64
	err := row.Scan(&t.ID, &t.Name, &created)
	t.CreatedAt = fromMS(created)
	return t, err
}

// Keys.

func (s *SQL) CreateKey(ctx context.Context, k Key) error {
	_, err := s.db.ExecContext(ctx, s.q("INSERT INTO keys (id, team_id, kind, name, hash, mask, value_length, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
		k.ID, k.TeamID, string(k.Kind), k.Name, k.Hash, k.Mask, k.ValueLength, ms(k.CreatedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: key %s: %w", k.ID, ErrConflict)
	}
	return err
}

const keyColumns = "id, team_id, kind, name, hash, mask, value_length, created_at"

func scanKey(row interface{ Scan(...any) error }) (Key, error) {
	var k Key
	var kind string
	var created int64
	err := row.Scan(&k.ID, &k.TeamID, &kind, &k.Name, &k.Hash, &k.Mask, &k.ValueLength, &created)
	k.Kind, k.CreatedAt = KeyKind(kind), fromMS(created)
	return k, err
}

func (s *SQL) KeyByHash(ctx context.Context, kind KeyKind, hash string) (Key, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, s.q("SELECT "+keyColumns+" FROM keys WHERE kind = ? AND hash = ?"), string(kind), hash))
	return k, notFound("key", "with that hash", err)
}

func (s *SQL) ListKeys(ctx context.Context, teamID string) ([]Key, error) {
	if teamID == "" {
		return nil, nil
	}
	return queryAll(ctx, s.db, s.q("SELECT "+keyColumns+" FROM keys WHERE team_id = ? ORDER BY created_at, id"), scanKey, teamID)
}

// queryAll runs a query and scans every row.
func queryAll[T any](ctx context.Context, db *sql.DB, query string, scan func(interface{ Scan(...any) error }) (T, error), args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (s *SQL) RenameKey(ctx context.Context, teamID, id, name string) error {
	return s.changeKey(ctx, teamID, id, "UPDATE keys SET name = ? WHERE team_id = ? AND id = ?", name, teamID, id)
}

func (s *SQL) DeleteKey(ctx context.Context, teamID, id string) error {
	return s.changeKey(ctx, teamID, id, "DELETE FROM keys WHERE team_id = ? AND id = ?", teamID, id)
}

// changeKey runs a statement on one of team's keys: ErrNotFound when it
// touches none (another team's key, or no team).
func (s *SQL) changeKey(ctx context.Context, teamID, id, stmt string, args ...any) error {
	if teamID == "" {
		return fmt.Errorf("store: key %s: %w", id, ErrNotFound)
	}
	res, err := s.db.ExecContext(ctx, s.q(stmt), args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("store: key %s: %w", id, ErrNotFound)
	}
	return nil
}

// Sandboxes.

const sandboxColumns = "id, team_id, template_id, alias, state, started_at, end_at, cpu_count, memory_mb, disk_size_mb, " +
	"envd_version, envd_access_token, traffic_access_token, metadata, env_vars, allow_internet_access, " +
	"auto_pause, auto_resume, secure, node, slot, runtime, extra, updated_at, paused_at, " +
	"image, auto_pause_memory, rootfs_dir, checkpoint, volume_mounts, paused_blob"

func sandboxArgs(sb *Sandbox) ([]any, error) {
	meta, err := json.Marshal(orEmpty(sb.Metadata))
	if err != nil {
		return nil, err
	}
	envs, err := json.Marshal(orEmpty(sb.EnvVars))
	if err != nil {
		return nil, err
	}
	mounts, err := json.Marshal(orNone(sb.VolumeMounts))
	if err != nil {
		return nil, err
	}
	var inet any
	if sb.AllowInternetAccess != nil {
		inet = b2i(*sb.AllowInternetAccess)
	}
	return []any{sb.ID, sb.TeamID, sb.TemplateID, sb.Alias, string(sb.State), ms(sb.StartedAt), ms(sb.EndAt),
		sb.CPUCount, sb.MemoryMB, sb.DiskSizeMB, sb.EnvdVersion, sb.EnvdAccessToken, sb.TrafficAccessToken,
		string(meta), string(envs), inet, b2i(sb.AutoPause), b2i(sb.AutoResume), b2i(sb.Secure),
		sb.Node, sb.Slot, sb.Runtime, sb.Extra, ms(sb.UpdatedAt), ms(sb.PausedAt),
		sb.Image, b2i(sb.AutoPauseMemory), sb.RootfsDir, sb.Checkpoint, string(mounts), sb.PausedBlob}, nil
}

func orNone(m []VolumeMount) []VolumeMount {
	if m == nil {
		return []VolumeMount{}
	}
	return m
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func scanSandbox(row interface{ Scan(...any) error }) (Sandbox, error) {
	var sb Sandbox
	var state, meta, envs, mounts string
	var started, end, updated, paused int64
	var inet sql.NullInt64
	var autoPause, autoResume, secure, autoPauseMemory int
	err := row.Scan(&sb.ID, &sb.TeamID, &sb.TemplateID, &sb.Alias, &state, &started, &end,
		&sb.CPUCount, &sb.MemoryMB, &sb.DiskSizeMB, &sb.EnvdVersion, &sb.EnvdAccessToken, &sb.TrafficAccessToken,
		&meta, &envs, &inet, &autoPause, &autoResume, &secure, &sb.Node, &sb.Slot, &sb.Runtime, &sb.Extra, &updated, &paused,
		&sb.Image, &autoPauseMemory, &sb.RootfsDir, &sb.Checkpoint, &mounts, &sb.PausedBlob)
	if err != nil {
		return sb, err
	}
	sb.State = SandboxState(state)
	sb.StartedAt, sb.EndAt, sb.UpdatedAt, sb.PausedAt = fromMS(started), fromMS(end), fromMS(updated), fromMS(paused)
	if inet.Valid {
		v := inet.Int64 != 0
		sb.AllowInternetAccess = &v
	}
	sb.AutoPause, sb.AutoResume, sb.Secure, sb.AutoPauseMemory = autoPause != 0, autoResume != 0, secure != 0, autoPauseMemory != 0
	if err := json.Unmarshal([]byte(meta), &sb.Metadata); err != nil {
		return sb, fmt.Errorf("store: sandbox %s metadata: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(envs), &sb.EnvVars); err != nil {
		return sb, fmt.Errorf("store: sandbox %s env vars: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(mounts), &sb.VolumeMounts); err != nil {
		return sb, fmt.Errorf("store: sandbox %s volume mounts: %w", sb.ID, err)
	}
	if len(sb.VolumeMounts) == 0 {
		sb.VolumeMounts = nil
	}
	return sb, nil
}

func (s *SQL) CreateSandbox(ctx context.Context, sb Sandbox) error {
	if sb.UpdatedAt.IsZero() {
		sb.UpdatedAt = time.Now()
	}
	args, err := sandboxArgs(&sb)
	if err != nil {
		return err
	}
	err = s.insertSandbox(ctx, sb, args)
	if isUniqueViolation(err) {
		return fmt.Errorf("store: sandbox %s: %w", sb.ID, ErrConflict)
	}
	return err
}

// insertSandbox inserts a sandbox with its route sequence value
// (routes.go), in one transaction with the check that each volume it
// mounts is its team's: the volumes' rows are share-locked (PostgreSQL;
// SQLite's write transactions are exclusive), so a concurrent
// DeleteVolume either sees this sandbox or deletes the volume before the
// check, which then fails.
//
// On PostgreSQL the sequence's row lock, which every create, pause and
// resume of the cluster waits for, is held only for the statement that
// takes it and the commit: the insert takes its value in the same
// statement (routeSeqInsert), and a sandbox without volumes is that one
// statement, committed by itself. It once took it with an UPDATE of its
// own and set it with another before the commit, two round trips to the
// database with every other create waiting (test/scale measured it).
func (s *SQL) insertSandbox(ctx context.Context, sb Sandbox, args []any) error {
	marks := strings.TrimSuffix(strings.Repeat("?, ", len(args)), ", ")
	if s.d == postgresDialect && len(sb.VolumeMounts) == 0 {
		_, err := s.db.ExecContext(ctx, s.q(routeSeqInsert(marks)), args...)
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, m := range sb.VolumeMounts {
		var id string
		err := tx.QueryRowContext(ctx, s.q("SELECT id FROM volumes WHERE id = ? AND team_id = ?"+s.forShare()), m.VolumeID, sb.TeamID).Scan(&id)
		if err != nil {
			return notFound("volume", m.VolumeID, err)
		}
	}
	if s.d == postgresDialect {
		if _, err := tx.ExecContext(ctx, s.q(routeSeqInsert(marks)), args...); err != nil {
			return err
		}
		return tx.Commit()
	}
	// SQLite has no UPDATE in a WITH; its write transaction is exclusive,
	// so the order of the two does not matter.
	seq, err := s.takeRouteSeq(ctx, tx)
	if err != nil {
		return err
	}
	insert := "INSERT INTO sandboxes (" + sandboxColumns + ", route_seq) VALUES (" + marks + ", ?)"
	if _, err := tx.ExecContext(ctx, insert, append(args, seq)...); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQL) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	sb, err := scanSandbox(s.db.QueryRowContext(ctx, s.q("SELECT "+sandboxColumns+" FROM sandboxes WHERE id = ?"), id))
	return sb, notFound("sandbox", id, err)
}

func (s *SQL) UpdateSandbox(ctx context.Context, id string, update func(*Sandbox) error) (Sandbox, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Sandbox{}, err
	}
	defer tx.Rollback()
	sb, err := scanSandbox(tx.QueryRowContext(ctx, s.q("SELECT "+sandboxColumns+" FROM sandboxes WHERE id = ?"+s.forUpdate()), id))
	if err != nil {
		return Sandbox{}, notFound("sandbox", id, err)
	}
	before := sb
	if err := update(&sb); err != nil {
		return Sandbox{}, err
	}
	sb.ID = id
	sb.UpdatedAt = time.Now()
	args, err := sandboxArgs(&sb)
	if err != nil {
		return Sandbox{}, err
	}
	if _, err := tx.ExecContext(ctx, s.q(updateByID("sandboxes", sandboxColumns)), append(args[1:], id)...); err != nil {
		return Sandbox{}, err
	}
	// The change's lifecycle events (sql_events.go) commit with it, or
	// not at all.
	if err := s.insertChanges(ctx, tx, &before, &sb); err != nil {
		return Sandbox{}, err
	}
	// Last: from here to the commit, every other route change waits.
	if routeChanged(&before, &sb) {
		if err := s.nextRouteSeq(ctx, tx, id); err != nil {
			return Sandbox{}, err
		}
	}
	return sb, tx.Commit()
}

// forUpdate locks the rows a read-modify-write transaction selects
// (PostgreSQL; SQLite's write transactions are exclusive already).
func (s *SQL) forUpdate() string {
	if s.d == postgresDialect {
		return " FOR UPDATE"
	}
	return ""
}

// forShare share-locks the rows a transaction relies on (PostgreSQL).
func (s *SQL) forShare() string {
	if s.d == postgresDialect {
		return " FOR SHARE"
	}
	return ""
}

// updateByID is the UPDATE of every column but the first (the ID) of a
// row of table, by ID: the row's values in column order, then the ID.
func updateByID(table, columns string) string {
	cols := strings.Split(columns, ", ")
	sets := make([]string, 0, len(cols)-1)
	for _, c := range cols[1:] {
		sets = append(sets, c+" = ?")
	}
	return "UPDATE " + table + " SET " + strings.Join(sets, ", ") + " WHERE id = ?"
}

func (s *SQL) DeleteSandbox(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, s.q("DELETE FROM sandboxes WHERE id = ?"), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: sandbox %s: %w", id, ErrNotFound)
	}
	return nil
}

// mayBePaused says whether a sandbox f keeps may be paused: only then
// can OrInBlobStore keep one that OnNodes does not.
func (f SandboxFilter) mayBePaused() bool {
	return len(f.States) == 0 || slices.Contains(f.States, StatePaused)
}

// sandboxWhere is the WHERE terms and arguments of filter f (its
// position After too when paged); none when it matches nothing (an empty
// team).
func (s *SQL) sandboxWhere(f SandboxFilter, paged bool) (where []string, args []any, none bool, err error) {
	switch {
	case f.Teams.None():
		return nil, nil, true, nil // no team matches nothing
	case !f.Teams.All():
		where = append(where, "team_id = ?")
		args = append(args, f.Teams.Team())
	}
	if len(f.States) > 0 {
		marks := strings.TrimSuffix(strings.Repeat("?, ", len(f.States)), ", ")
		where = append(where, "state IN ("+marks+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	if f.TemplateID != "" {
		where = append(where, "template_id = ?")
		args = append(args, f.TemplateID)
	}
	if f.Node != "" {
		where = append(where, "node = ?")
		args = append(args, f.Node)
	}
	// Metadata is JSON text; each pair is matched in SQL, so that a page's
	// LIMIT applies in the query rather than after reading every sandbox
	// of the team (test/scale).
	for _, k := range slices.Sorted(maps.Keys(f.Metadata)) {
		if s.d == postgresDialect {
			where = append(where, "(metadata::jsonb ->> ?) = ?")
		} else {
			where = append(where, "EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m WHERE m.key = ? AND m.type = 'text' AND m.value = ?)")
		}
		args = append(args, k, f.Metadata[k])
	}
	if f.OnNodes != nil {
		var on []string
		if len(f.OnNodes) > 0 {
			on = append(on, "node IN ("+strings.TrimSuffix(strings.Repeat("?, ", len(f.OnNodes)), ", ")+")")
			for _, n := range f.OnNodes {
				args = append(args, n)
			}
		}
		if f.OrInBlobStore && f.mayBePaused() {
			// Not otherwise: paused_blob is in no index, and the term
			// alone made the count of running sandboxes read each row.
			on = append(on, "(state = ? AND paused_blob <> '')")
			args = append(args, string(StatePaused))
		}
		if len(on) == 0 {
			return nil, nil, true, nil
		}
		where = append(where, "("+strings.Join(on, " OR ")+")")
	}
	if !f.StartedAfter.IsZero() {
		where = append(where, "started_at >= ?")
		args = append(args, ms(f.StartedAfter))
	}
	if paged && f.After != nil {
		op := ">"
		if f.Desc {
			op = "<"
		}
		where = append(where, "(started_at "+op+" ? OR (started_at = ? AND id "+op+" ?))")
		args = append(args, ms(f.After.StartedAt), ms(f.After.StartedAt), f.After.ID)
	}
	return where, args, false, nil
}

func (s *SQL) ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error) {
	where, args, none, err := s.sandboxWhere(f, true)
	if none || err != nil {
		return nil, err
	}
	query := "SELECT " + sandboxColumns + " FROM sandboxes"
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	if f.Desc {
		query += " ORDER BY started_at DESC, id DESC"
	} else {
		query += " ORDER BY started_at, id"
	}
	if f.Limit > 0 {
		query += " LIMIT " + strconv.Itoa(f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		if !hasMetadata(sb.Metadata, f.Metadata) {
			continue
		}
		out = append(out, sb)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, rows.Err()
}

// CountSandboxes counts in SQL, by node. One team's sandboxes of some
// states (maybe of one node) are read from the counts the database keeps
// per team, state and node (sandbox_counts, migration 0031): about one
// row per node, where counting the sandboxes reads an index entry for
// each (test/scale: 10,000 running, on every page of GET /v2/sandboxes).
// Any other filter counts the sandboxes, with the index of team, state
// and node (migration 0025) when it has no metadata terms.
//
// OnNodes, unless OrInBlobStore can keep sandboxes of other nodes, is
// applied to the counts by node rather than to each sandbox in the query:
// as a term of the query it is a list of every live node's name, compared
// with each of the team's sandboxes (test/scale measured the count of
// 10,000 running sandboxes at 100 nodes 2.5 times slower with it).
func (s *SQL) CountSandboxes(ctx context.Context, f SandboxFilter) (map[string]int, error) {
	var on map[string]bool
	if f.OnNodes != nil && !(f.OrInBlobStore && f.mayBePaused()) {
		on = make(map[string]bool, len(f.OnNodes))
		for _, n := range f.OnNodes {
			on[n] = true
		}
		if len(on) == 0 {
			return map[string]int{}, nil
		}
		f.OnNodes, f.OrInBlobStore = nil, false
	}
	query, args, none, err := s.countQuery(f)
	if none || err != nil {
		return map[string]int{}, err
	}
	out := map[string]int{}
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var node string
		var n int
		if err := rows.Scan(&node, &n); err != nil {
			return nil, err
		}
		if on != nil && !on[node] {
			continue
		}
		out[node] = n
	}
	return out, rows.Err()
}

// countQuery is the query of f's counts by node (node, count), from the
// kept counts when they answer f; none when f matches nothing.
func (s *SQL) countQuery(f SandboxFilter) (query string, args []any, none bool, err error) {
	if f.Teams.None() {
		return "", nil, true, nil // no team matches nothing
	}
	if f.keptCountsAnswer() {
		where := []string{"team_id = ?"}
		args = append(args, f.Teams.Team())
		if len(f.States) > 0 {
			where = append(where, "state IN ("+strings.TrimSuffix(strings.Repeat("?, ", len(f.States)), ", ")+")")
			for _, st := range f.States {
				args = append(args, string(st))
			}
		}
		if f.Node != "" {
			where = append(where, "node = ?")
			args = append(args, f.Node)
		}
		return "SELECT node, CAST(SUM(n) AS BIGINT) FROM sandbox_counts WHERE " + strings.Join(where, " AND ") +
			" GROUP BY node HAVING SUM(n) > 0", args, false, nil
	}
	where, args, none, err := s.sandboxWhere(f, false)
	if none || err != nil {
		return "", nil, none, err
	}
	cond := ""
	if len(where) > 0 {
		cond = " WHERE " + strings.Join(where, " AND ")
	}
	return "SELECT node, COUNT(*) FROM sandboxes" + cond + " GROUP BY node", args, false, nil
}

// keptCountsAnswer says whether the counts kept per team, state and node
// answer f (its page aside): one team's sandboxes, by state and node
// only. OnNodes must be applied to the counts by the caller.
func (f SandboxFilter) keptCountsAnswer() bool {
	return !f.Teams.All() && f.Teams.Team() != "" && len(f.Metadata) == 0 && f.TemplateID == "" &&
		f.OnNodes == nil && f.StartedAfter.IsZero()
}

func hasMetadata(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (s *SQL) ExpiredSandboxes(ctx context.Context, now time.Time) ([]Sandbox, error) {
	return queryAll(ctx, s.db, s.q("SELECT "+sandboxColumns+" FROM sandboxes WHERE state IN (?, ?) AND end_at <= ? ORDER BY end_at"),
		scanSandbox, string(StateRunning), string(StatePaused), ms(now))
}
