package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// What a PostgreSQL outage looks like to the store's callers is
// Unavailable; what a wrong operation looks like is not.
func TestUnavailable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{ErrNotFound, false},
		{errors.New("store: something else"), false},
		{&pgconn.PgError{Code: "23505"}, false}, // unique violation
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "57P03"}), true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
	} {
		if got := Unavailable(c.err); got != c.want {
			t.Errorf("Unavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	// A server that is not there: the socket directory of none.
	dir := t.TempDir()
	ctx := context.Background()
	db, err := sql.Open("pgx", "host="+dir+" user=nobody dbname=none sslmode=disable connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.PingContext(ctx)
	if err == nil || !Unavailable(err) {
		t.Errorf("a ping of no server: %v, Unavailable %v", err, Unavailable(err))
	}
}
