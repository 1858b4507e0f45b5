package store

import (
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrUnavailable is what a store error Unavailable recognises becomes
// where the driver's error cannot travel (a node's answer to the api).
var ErrUnavailable = errors.New("the store is unavailable for a moment")

// Unavailable reports whether err says the store cannot be reached right
// now rather than that the operation was wrong: PostgreSQL down or
// restarting (connection refused, a connection cut, "the database system
// is starting up", an administrator's or a crash's shutdown). The api
// answers those 503, to be retried, not 500 (docs/chaos.md: PostgreSQL
// stopped with -m immediate and restarted).
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08: connection exception; 57P01–57P03: admin shutdown,
		// crash shutdown, cannot connect now (starting up, recovering).
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) ||
		errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.SafeToRetry(err)
}
