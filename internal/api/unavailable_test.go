package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// While PostgreSQL is down or restarting (docs/chaos.md), a request
// answers 503, to be retried, with the E2B error shape; not a 500.
func TestStoreOutageIs503(t *testing.T) {
	starting := fmt.Errorf("store: reading a key: %w", &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"})

	// The key's lookup fails.
	hs := newHarness(t, Config{Store: fakeStore{err: starting}})
	w := hs.do("GET", "/sandboxes", keyTeam1, "")
	if code, msg := errorBody(t, w); code != http.StatusServiceUnavailable || !strings.Contains(msg, "retry") {
		t.Errorf("auth during an outage: %d %q, want 503 saying retry", code, msg)
	}

	// A sandbox call fails on the store.
	hs = newHarness(t, Config{})
	hs.sandboxes.create = func(sandbox.CreateRequest) (store.Sandbox, error) { return store.Sandbox{}, starting }
	w = hs.do("POST", "/sandboxes", keyTeam1, `{"templateID":"base"}`)
	if code, msg := errorBody(t, w); code != http.StatusServiceUnavailable || strings.Contains(msg, "57P03") {
		t.Errorf("create during an outage: %d %q, want 503 without the driver's detail", code, msg)
	}

	// Any other failure is still a 500.
	hs = newHarness(t, Config{Store: fakeStore{err: fmt.Errorf("store: %w", &pgconn.PgError{Code: "42P01"})}})
	if w := hs.do("GET", "/sandboxes", keyTeam1, ""); w.Code != http.StatusInternalServerError {
		t.Errorf("another store error: %d, want 500", w.Code)
	}
}
