package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestIsUniqueViolation feeds isUniqueViolation real errors of both
// databases: duplicate keys are recognised, other constraint and SQL
// errors are not, and neither is an error that merely reads like one.
func TestIsUniqueViolation(t *testing.T) {
	for kind, b := range blankDatabases(t) {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			for _, stmt := range []string{
				"CREATE TABLE parent (id TEXT PRIMARY KEY)",
				"CREATE TABLE child (id TEXT PRIMARY KEY, parent TEXT NOT NULL REFERENCES parent(id), code TEXT NOT NULL, n INTEGER NOT NULL CHECK (n > 0))",
				"CREATE UNIQUE INDEX child_by_code ON child (code)",
				"INSERT INTO parent (id) VALUES ('p')",
				"INSERT INTO child (id, parent, code, n) VALUES ('c', 'p', 'x', 1)",
			} {
				if _, err := b.db.ExecContext(ctx, stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
			cases := []struct {
				name   string
				insert string
				unique bool
			}{
				{"primary key", "INSERT INTO child (id, parent, code, n) VALUES ('c', 'p', 'y', 1)", true},
				{"unique index", "INSERT INTO child (id, parent, code, n) VALUES ('d', 'p', 'x', 1)", true},
				{"not null", "INSERT INTO child (id, parent, code, n) VALUES ('e', 'p', NULL, 1)", false},
				{"foreign key", "INSERT INTO child (id, parent, code, n) VALUES ('f', 'nope', 'z', 1)", false},
				{"check", "INSERT INTO child (id, parent, code, n) VALUES ('g', 'p', 'w', 0)", false},
				{"syntax", "INSERT INTO child VALUES (", false},
				{"missing table", "INSERT INTO nope (id) VALUES ('x')", false},
			}
			for _, c := range cases {
				_, err := b.db.ExecContext(ctx, c.insert)
				if err == nil {
					t.Errorf("%s: the insert succeeded", c.name)
					continue
				}
				if got := isUniqueViolation(err); got != c.unique {
					t.Errorf("%s: isUniqueViolation(%v) = %v, want %v", c.name, err, got, c.unique)
				}
				if got := isUniqueViolation(fmt.Errorf("wrapped: %w", err)); got != c.unique {
					t.Errorf("%s, wrapped: isUniqueViolation = %v, want %v", c.name, got, c.unique)
				}
			}
		})
	}
	for _, err := range []error{
		nil,
		errors.New("constraint failed: UNIQUE constraint failed: child.code (2067)"),
		errors.New(`ERROR: duplicate key value violates unique constraint "child_pkey" (SQLSTATE 23505)`),
	} {
		if isUniqueViolation(err) {
			t.Errorf("isUniqueViolation(%v) = true for an error that is no driver's", err)
		}
	}
}
