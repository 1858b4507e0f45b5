package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Templates.
//
// A template's Names are kept twice, in one transaction: as a JSON list
// in templates.names (their order) and as rows of template_names, whose
// primary key (team_id, name) makes a name belong to one template of its
// team. Names are per team: other teams' are neither found nor in the way.
//
// On PostgreSQL, operations that change several tables lock rows in one
// order, template then its builds, so that they serialise without
// deadlocks and leave nothing behind a deleted template. On SQLite every
// write transaction holds the database's write lock from BEGIN.

const templateColumns = "id, team_id, names, public, cpu_count, memory_mb, disk_size_mb, " +
	"created_at, updated_at, last_spawned_at, spawn_count, build_count, created_by, snapshot_of"

func templateArgs(t *Template) ([]any, error) {
	names, err := json.Marshal(orEmptyList(t.Names))
	if err != nil {
		return nil, err
	}
	return []any{t.ID, t.TeamID, string(names), b2i(t.Public), t.CPUCount, t.MemoryMB, t.DiskSizeMB,
		ms(t.CreatedAt), ms(t.UpdatedAt), ms(t.LastSpawnedAt), t.SpawnCount, t.BuildCount, t.CreatedBy, t.SnapshotOf}, nil
}

func orEmptyList(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

func scanTemplate(row interface{ Scan(...any) error }) (Template, error) {
	var t Template
	var names string
	var public int
	var created, updated, spawned int64
	err := row.Scan(&t.ID, &t.TeamID, &names, &public, &t.CPUCount, &t.MemoryMB, &t.DiskSizeMB,
		&created, &updated, &spawned, &t.SpawnCount, &t.BuildCount, &t.CreatedBy, &t.SnapshotOf)
	if err != nil {
		return t, err
	}
	t.Public = public != 0
	t.CreatedAt, t.UpdatedAt, t.LastSpawnedAt = fromMS(created), fromMS(updated), fromMS(spawned)
	if err := json.Unmarshal([]byte(names), &t.Names); err != nil {
		return t, fmt.Errorf("store: template %s names: %w", t.ID, err)
	}
	if len(t.Names) == 0 {
		t.Names = nil
	}
	return t, nil
}

// cleanNames drops empty and repeated names, keeping the first of each.
func cleanNames(names []string) []string {
	if len(names) == 0 {
		return nil
	}
	seen := make(map[string]bool, len(names))
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// insertNames records names as templateID's in its team; a name held by
// another template of the team is ErrConflict. The template's old rows
// must be gone.
func (s *SQL) insertNames(ctx context.Context, tx *sql.Tx, teamID, templateID string, names []string) error {
	if len(names) > 0 && teamID == "" {
		return errors.New("store: a named template needs a team")
	}
	for _, n := range names {
		_, err := tx.ExecContext(ctx, s.q("INSERT INTO template_names (team_id, name, template_id) VALUES (?, ?, ?)"), teamID, n, templateID)
		if isUniqueViolation(err) {
			return fmt.Errorf("store: template name %q: %w", n, ErrConflict)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *SQL) CreateTemplate(ctx context.Context, t Template) error {
	t.Names = cleanNames(t.Names)
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now()
	}
	if t.UpdatedAt.IsZero() {
		t.UpdatedAt = t.CreatedAt
	}
	args, err := templateArgs(&t)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, s.q("INSERT INTO templates ("+templateColumns+") VALUES ("+marks(len(args))+")"), args...)
	if isUniqueViolation(err) {
		return fmt.Errorf("store: template %s: %w", t.ID, ErrConflict)
	}
	if err != nil {
		return err
	}
	if err := s.insertNames(ctx, tx, t.TeamID, t.ID, t.Names); err != nil {
		return err
	}
	return tx.Commit()
}

func marks(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func (s *SQL) GetTemplate(ctx context.Context, id string) (Template, error) {
	t, err := scanTemplate(s.db.QueryRowContext(ctx, s.q("SELECT "+templateColumns+" FROM templates WHERE id = ?"), id))
	return t, notFound("template", id, err)
}

func (s *SQL) TemplateByName(ctx context.Context, teamID, name string) (Template, error) {
	if teamID == "" {
		return Template{}, fmt.Errorf("store: template named %q of no team: %w", name, ErrNotFound)
	}
	t, err := scanTemplate(s.db.QueryRowContext(ctx, s.q("SELECT "+prefixed("t.", templateColumns)+
		" FROM templates t JOIN template_names n ON n.template_id = t.id WHERE n.team_id = ? AND n.name = ?"), teamID, name))
	return t, notFound("template", fmt.Sprintf("named %q", name), err)
}

// prefixed qualifies each of a comma-separated column list.
func prefixed(p, columns string) string {
	cols := strings.Split(columns, ", ")
	for i, c := range cols {
		cols[i] = p + c
	}
	return strings.Join(cols, ", ")
}

func (s *SQL) ListTemplates(ctx context.Context, teamID string) ([]Template, error) {
	return queryAll(ctx, s.db, s.q("SELECT "+templateColumns+" FROM templates WHERE team_id = ? ORDER BY created_at, id"), scanTemplate, teamID)
}

func (s *SQL) ListSnapshotTemplates(ctx context.Context, f SnapshotFilter) ([]Template, error) {
	if f.TeamID == "" {
		return nil, errors.New("store: listing snapshots needs a team")
	}
	where := []string{"t.team_id = ?", "t.snapshot_of <> ''"}
	args := []any{f.TeamID}
	if f.SandboxID != "" {
		where = append(where, "t.snapshot_of = ?")
		args = append(args, f.SandboxID)
	}
	if f.Name != "" {
		where = append(where, "t.id IN (SELECT template_id FROM template_names WHERE team_id = ? AND name = ?)")
		args = append(args, f.TeamID, f.Name)
	}
	if f.After != nil {
		where = append(where, "(t.created_at < ? OR (t.created_at = ? AND t.id < ?))")
		args = append(args, ms(f.After.StartedAt), ms(f.After.StartedAt), f.After.ID)
	}
	query := "SELECT " + prefixed("t.", templateColumns) + " FROM templates t WHERE " + strings.Join(where, " AND ") +
		" ORDER BY t.created_at DESC, t.id DESC"
	if f.Limit > 0 {
		query += " LIMIT " + strconv.Itoa(f.Limit)
	}
	return queryAll(ctx, s.db, s.q(query), scanTemplate, args...)
}

func (s *SQL) UpdateTemplate(ctx context.Context, id string, update func(*Template) error) (Template, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Template{}, err
	}
	defer tx.Rollback()
	t, err := scanTemplate(tx.QueryRowContext(ctx, s.q("SELECT "+templateColumns+" FROM templates WHERE id = ?"+s.forUpdate()), id))
	if err != nil {
		return Template{}, notFound("template", id, err)
	}
	if err := update(&t); err != nil {
		return Template{}, err
	}
	t.ID = id
	t.Names = cleanNames(t.Names)
	t.UpdatedAt = time.Now()
	args, err := templateArgs(&t)
	if err != nil {
		return Template{}, err
	}
	if _, err := tx.ExecContext(ctx, s.q(updateByID("templates", templateColumns)), append(args[1:], id)...); err != nil {
		return Template{}, err
	}
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM template_names WHERE template_id = ?"), id); err != nil {
		return Template{}, err
	}
	if err := s.insertNames(ctx, tx, t.TeamID, id, t.Names); err != nil {
		return Template{}, err
	}
	return t, tx.Commit()
}

func (s *SQL) DeleteTemplate(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var found string
	if err := tx.QueryRowContext(ctx, s.q("SELECT id FROM templates WHERE id = ?"+s.forUpdate()), id).Scan(&found); err != nil {
		return notFound("template", id, err)
	}
	// Lock the builds too, so that a concurrent AppendBuildLogs or SetTag
	// either finishes first (and its rows are deleted here) or finds no
	// build afterwards.
	if s.d == postgresDialect {
		if _, err := tx.ExecContext(ctx, s.q("SELECT id FROM template_builds WHERE template_id = ? FOR UPDATE"), id); err != nil {
			return err
		}
	}
	for _, stmt := range []string{
		"DELETE FROM template_names WHERE template_id = ?",
		"DELETE FROM template_tags WHERE template_id = ?",
		"DELETE FROM build_logs WHERE build_id IN (SELECT id FROM template_builds WHERE template_id = ?)",
		"DELETE FROM snapshot_blobs WHERE build_id IN (SELECT id FROM template_builds WHERE template_id = ?)",
		"DELETE FROM template_builds WHERE template_id = ?",
		"DELETE FROM templates WHERE id = ?",
	} {
		if _, err := tx.ExecContext(ctx, s.q(stmt), id); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Builds.

const buildColumns = "id, template_id, status, cpu_count, memory_mb, disk_size_mb, envd_version, spec, " +
	"reason_message, reason_step, node, created_at, updated_at, finished_at"

func buildArgs(b *Build) []any {
	return []any{b.ID, b.TemplateID, string(b.Status), b.CPUCount, b.MemoryMB, b.DiskSizeMB, b.EnvdVersion, b.Spec,
		b.ReasonMessage, b.ReasonStep, b.Node, ms(b.CreatedAt), ms(b.UpdatedAt), ms(b.FinishedAt)}
}

func scanBuild(row interface{ Scan(...any) error }) (Build, error) {
	var b Build
	var status string
	var created, updated, finished int64
	err := row.Scan(&b.ID, &b.TemplateID, &status, &b.CPUCount, &b.MemoryMB, &b.DiskSizeMB, &b.EnvdVersion, &b.Spec,
		&b.ReasonMessage, &b.ReasonStep, &b.Node, &created, &updated, &finished)
	b.Status = BuildStatus(status)
	b.CreatedAt, b.UpdatedAt, b.FinishedAt = fromMS(created), fromMS(updated), fromMS(finished)
	return b, err
}

func (s *SQL) CreateBuild(ctx context.Context, b Build) error {
	if b.CreatedAt.IsZero() {
		b.CreatedAt = time.Now()
	}
	if b.UpdatedAt.IsZero() {
		b.UpdatedAt = b.CreatedAt
	}
	args := buildArgs(&b)
	_, err := s.db.ExecContext(ctx, s.q("INSERT INTO template_builds ("+buildColumns+") VALUES ("+marks(len(args))+")"), args...)
	if isUniqueViolation(err) {
		return fmt.Errorf("store: build %s: %w", b.ID, ErrConflict)
	}
	return err
}

func (s *SQL) GetBuild(ctx context.Context, id string) (Build, error) {
	b, err := scanBuild(s.db.QueryRowContext(ctx, s.q("SELECT "+buildColumns+" FROM template_builds WHERE id = ?"), id))
	return b, notFound("build", id, err)
}

func (s *SQL) UpdateBuild(ctx context.Context, id string, update func(*Build) error) (Build, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Build{}, err
	}
	defer tx.Rollback()
	b, err := scanBuild(tx.QueryRowContext(ctx, s.q("SELECT "+buildColumns+" FROM template_builds WHERE id = ?"+s.forUpdate()), id))
	if err != nil {
		return Build{}, notFound("build", id, err)
	}
	if err := update(&b); err != nil {
		return Build{}, err
	}
	b.ID = id
	b.UpdatedAt = time.Now()
	args := buildArgs(&b)
	if _, err := tx.ExecContext(ctx, s.q(updateByID("template_builds", buildColumns)), append(args[1:], id)...); err != nil {
		return Build{}, err
	}
	return b, tx.Commit()
}

func (s *SQL) ListBuilds(ctx context.Context, templateID string) ([]Build, error) {
	return queryAll(ctx, s.db, s.q("SELECT "+buildColumns+" FROM template_builds WHERE template_id = ? ORDER BY created_at, id"), scanBuild, templateID)
}

func (s *SQL) BuildsByStatus(ctx context.Context, statuses ...BuildStatus) ([]Build, error) {
	if len(statuses) == 0 {
		return nil, nil
	}
	args := make([]any, len(statuses))
	for i, st := range statuses {
		args[i] = string(st)
	}
	return queryAll(ctx, s.db, s.q("SELECT "+buildColumns+" FROM template_builds WHERE status IN ("+marks(len(args))+") ORDER BY created_at, id"), scanBuild, args...)
}

// Build logs.

// levelRank orders log levels by severity; an unknown level counts as info.
func levelRank(level string) int {
	switch strings.ToLower(level) {
	case "debug":
		return 0
	case "warn":
		return 2
	case "error":
		return 3
	default:
		return 1
	}
}

// logBatch bounds the rows of one INSERT (7 parameters each).
const logBatch = 100

// MaxBuildLogEntries bounds one build's log in the store, a backstop
// behind the builder's own caps (internal/template keeps far fewer): a
// build's output must never fill the database.
const MaxBuildLogEntries = 50000

func (s *SQL) AppendBuildLogs(ctx context.Context, buildID string, entries ...BuildLogEntry) error {
	if len(entries) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// The build's row lock serialises appenders on PostgreSQL (SQLite's
	// write transactions already do).
	var found string
	if err := tx.QueryRowContext(ctx, s.q("SELECT id FROM template_builds WHERE id = ?"+s.forUpdate()), buildID).Scan(&found); err != nil {
		return notFound("build", buildID, err)
	}
	var last int64
	if err := tx.QueryRowContext(ctx, s.q("SELECT COALESCE(MAX(seq), -1) FROM build_logs WHERE build_id = ?"), buildID).Scan(&last); err != nil {
		return err
	}
	var full error
	if room := MaxBuildLogEntries - int(last+1); len(entries) > room {
		full = fmt.Errorf("store: build %s: %d entries dropped: %w", buildID, len(entries)-max(room, 0), ErrLogFull)
		if room <= 0 {
			return full
		}
		entries = entries[:room]
	}
	for start := 0; start < len(entries); start += logBatch {
		batch := entries[start:min(start+logBatch, len(entries))]
		rows := make([]string, len(batch))
		args := make([]any, 0, 7*len(batch))
		for i, e := range batch {
			last++
			rows[i] = "(?, ?, ?, ?, ?, ?, ?)"
			args = append(args, buildID, last, ms(e.Time), e.Level, levelRank(e.Level), e.Step, e.Message)
		}
		if _, err := tx.ExecContext(ctx, s.q("INSERT INTO build_logs (build_id, seq, ts, level, level_rank, step, message) VALUES "+strings.Join(rows, ", ")), args...); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	return full
}

func (s *SQL) BuildLogs(ctx context.Context, buildID string, offset, limit int, minLevel string) ([]BuildLogEntry, error) {
	if limit <= 0 {
		return []BuildLogEntry{}, nil
	}
	offset = max(offset, 0)
	query := "SELECT ts, level, step, message FROM build_logs WHERE build_id = ?"
	args := []any{buildID}
	if minLevel != "" {
		query += " AND level_rank >= ?"
		args = append(args, levelRank(minLevel))
	}
	query += " ORDER BY seq LIMIT ? OFFSET ?"
	args = append(args, limit, offset)
	out, err := queryAll(ctx, s.db, s.q(query), func(row interface{ Scan(...any) error }) (BuildLogEntry, error) {
		var e BuildLogEntry
		var ts int64
		err := row.Scan(&ts, &e.Level, &e.Step, &e.Message)
		e.Time = fromMS(ts)
		return e, err
	}, args...)
	if out == nil && err == nil {
		out = []BuildLogEntry{}
	}
	return out, err
}

// Tags.

func scanTag(row interface{ Scan(...any) error }) (Tag, error) {
	var t Tag
	var created int64
	err := row.Scan(&t.TemplateID, &t.Tag, &t.BuildID, &created)
	t.CreatedAt = fromMS(created)
	return t, err
}

// SetTag requires the build to be one of the template's (ErrNotFound
// otherwise). Moving a tag sets its CreatedAt to t's: the time it was
// pointed at its build. A zero CreatedAt is now.
func (s *SQL) SetTag(ctx context.Context, t Tag) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now()
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	lock := ""
	if s.d == postgresDialect {
		lock = " FOR SHARE" // against a concurrent DeleteTemplate
	}
	var found string
	if err := tx.QueryRowContext(ctx, s.q("SELECT id FROM template_builds WHERE id = ? AND template_id = ?"+lock), t.BuildID, t.TemplateID).Scan(&found); err != nil {
		return notFound("build", t.BuildID+" of template "+t.TemplateID, err)
	}
	if _, err := tx.ExecContext(ctx, s.q("INSERT INTO template_tags (template_id, tag, build_id, created_at) VALUES (?, ?, ?, ?) "+
		"ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, created_at = excluded.created_at"),
		t.TemplateID, t.Tag, t.BuildID, ms(t.CreatedAt)); err != nil {
		return err
	}
	if t.SnapshotOf != "" {
		// The snapshot is usable from here: its checkpointed event
		// commits with its tag.
		if err := s.insertSnapshotEvent(ctx, tx, t.SnapshotOf); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (s *SQL) GetTag(ctx context.Context, templateID, tag string) (Tag, error) {
	t, err := scanTag(s.db.QueryRowContext(ctx, s.q("SELECT template_id, tag, build_id, created_at FROM template_tags WHERE template_id = ? AND tag = ?"), templateID, tag))
	return t, notFound("tag", templateID+":"+tag, err)
}

func (s *SQL) DeleteTag(ctx context.Context, templateID, tag string) error {
	res, err := s.db.ExecContext(ctx, s.q("DELETE FROM template_tags WHERE template_id = ? AND tag = ?"), templateID, tag)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: tag %s:%s: %w", templateID, tag, ErrNotFound)
	}
	return nil
}

func (s *SQL) ListTags(ctx context.Context, templateID string) ([]Tag, error) {
	return queryAll(ctx, s.db, s.q("SELECT template_id, tag, build_id, created_at FROM template_tags WHERE template_id = ? ORDER BY tag"), scanTag, templateID)
}
