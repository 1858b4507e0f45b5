package noderpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/warren-sandbox/warren/internal/cluster"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
)

// A node's own errors come back as the manager's (an unknown one as a
// plain error, a 500); anything that is not the node's answer (it died
// mid-call, or something else answered) is sandbox.ErrNodeUnavailable,
// a 503, never a 500.
func TestClientErrors(t *testing.T) {
	auth, _ := cluster.NewAuth([]byte(strings.Repeat("e", 32)))
	for name, c := range map[string]struct {
		node    http.Handler
		kind    error // nil: none of the manager's kinds
		message string
	}{
		"a kind": {node: Handler(Served{Sandboxes: failing{err: fmt.Errorf("%w: sbx1", sandbox.ErrNotFound)}, Teams: fakeTeams{"t1": true}}, auth.Guard("n1")),
			kind: sandbox.ErrNotFound, message: "sandbox not found: sbx1"},
		"the node's own failure": {node: Handler(Served{Sandboxes: failing{err: errors.New("disk on fire")}, Teams: fakeTeams{"t1": true}}, auth.Guard("n1")),
			message: "disk on fire"},
		"dies mid-call": {node: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		}), kind: sandbox.ErrNodeUnavailable},
		"not a node": {node: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "a web server", http.StatusInternalServerError)
		}), kind: sandbox.ErrNodeUnavailable},
	} {
		srv := httptest.NewServer(c.node)
		cl := NewClient("n1", strings.TrimPrefix(srv.URL, "http://"), NewTransport(auth))
		err := cl.Kill(context.Background(), team.MustParse("t1"), "sbx1")
		srv.Close()
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		for _, k := range []error{sandbox.ErrNotFound, sandbox.ErrNodeUnavailable} {
			if errors.Is(err, k) != (k == c.kind) {
				t.Errorf("%s: %v: errors.Is(%v) = %v", name, err, k, !(k == c.kind))
			}
		}
		if !strings.Contains(err.Error(), c.message) {
			t.Errorf("%s: %q does not say %q", name, err, c.message)
		}
	}
	// Nothing listens there.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if err := NewClient("n1", addr, NewTransport(auth)).Kill(context.Background(), team.MustParse("t1"), "x"); !errors.Is(err, sandbox.ErrNodeUnavailable) {
		t.Errorf("a node that is gone: %v", err)
	}
}

// failing is a node whose Kill fails with err (it serves nothing else).
type failing struct {
	Sandboxes
	err error
}

func (f failing) Kill(context.Context, team.ID, string) error { return f.err }

// A node's disk below its reserve comes back as sandbox.ErrDiskFull (a
// 507) and still as ErrNoCapacity (dispatch tries another node).
func TestClientDiskFull(t *testing.T) {
	auth, _ := cluster.NewAuth([]byte(strings.Repeat("e", 32)))
	full := fmt.Errorf("%w: %w: the node's data disk has 10 MB free", sandbox.ErrNoCapacity, sandbox.ErrDiskFull)
	srv := httptest.NewServer(Handler(Served{Sandboxes: failing{err: full}, Teams: fakeTeams{"t1": true}}, auth.Guard("n1")))
	defer srv.Close()
	cl := NewClient("n1", strings.TrimPrefix(srv.URL, "http://"), NewTransport(auth))
	err := cl.Kill(context.Background(), team.MustParse("t1"), "sbx1")
	if !errors.Is(err, sandbox.ErrDiskFull) || !errors.Is(err, sandbox.ErrNoCapacity) || !strings.Contains(fmt.Sprint(err), "10 MB free") {
		t.Errorf("a node's full disk: %v", err)
	}
}

// A node whose store is down or restarting answers a kind the api turns
// back into store.ErrUnavailable (a 503, retried), not a 500.
func TestClientStoreUnavailable(t *testing.T) {
	auth, _ := cluster.NewAuth([]byte(strings.Repeat("e", 32)))
	down := fmt.Errorf("store: %w", &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"})
	srv := httptest.NewServer(Handler(Served{Sandboxes: failing{err: down}, Teams: fakeTeams{"t1": true}}, auth.Guard("n1")))
	defer srv.Close()
	err := NewClient("n1", strings.TrimPrefix(srv.URL, "http://"), NewTransport(auth)).Kill(context.Background(), team.MustParse("t1"), "sbx1")
	if !errors.Is(err, store.ErrUnavailable) || !store.Unavailable(err) {
		t.Errorf("a node's store outage: %v", err)
	}
}
