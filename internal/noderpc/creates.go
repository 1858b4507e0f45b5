package noderpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/team"
	nodev1 "github.com/warren-sandbox/warren/proto/node/v1"
)

// Abandoned creates. An api that sends CreateSandbox may not take the
// answer: its call timed out, the connection broke, its own caller left.
// The node may have made the sandbox all the same, which would then run
// unseen and count against its team. So each create carries a request ID
// the node remembers (createLog), and an api that did not take the answer
// calls AbandonCreate with it: the node kills what the create made, or
// kills it when the create ends, or refuses the create if it arrives
// after its abandonment. A handler that sees its own caller gone once the
// create has ended kills what it made too, without waiting to be told.

// Bounds of a node's memory of request IDs: an AbandonCreate comes within
// seconds of its create (the api calls it as soon as it gave up).
const (
	createLogMax = 4096
	createLogTTL = 10 * time.Minute
	// maxRequestID bounds a request ID's length.
	maxRequestID = 64
)

// errAbandoned refuses a create whose request was abandoned before it
// arrived.
var errAbandoned = fmt.Errorf("%w: the api abandoned this create", sandbox.ErrConflict)

// newRequestID is a create's random request ID.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails on Linux
	return hex.EncodeToString(b[:])
}

// validRequestID: 1 to maxRequestID letters, digits, '-' and '_'.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// createLog is what a node remembers of its recent creates, by team and
// request ID: at most max, each for ttl after it ended (a create under
// way is never forgotten).
type createLog struct {
	max int
	ttl time.Duration
	now func() time.Time

	mu        sync.Mutex
	entries   map[createKey]*createEntry
	lastSweep time.Time
}

type createKey struct{ team, request string }

type createEntry struct {
	at        time.Time // when it began, then when it ended
	running   bool
	abandoned bool
	sandbox   string // what it made and still runs, once it ended
}

func newCreateLog() *createLog {
	return &createLog{max: createLogMax, ttl: createLogTTL, now: time.Now, entries: map[createKey]*createEntry{}}
}

// begin records a create under way; a request ID seen before is refused
// (errAbandoned if it was abandoned).
func (l *createLog) begin(team, request string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := createKey{team, request}
	if e := l.entries[k]; e != nil {
		if e.abandoned {
			return errAbandoned
		}
		return fmt.Errorf("%w: request ID %s was used before", sandbox.ErrInvalid, request)
	}
	if !l.roomLocked() {
		return fmt.Errorf("%w: %d creates are under way on this node", sandbox.ErrNoCapacity, len(l.entries))
	}
	l.entries[k] = &createEntry{at: l.now(), running: true}
	return nil
}

// end records that a create has ended, making sandbox ("" if none); kill
// says the create was abandoned meanwhile, so that what it made is the
// caller's to kill.
func (l *createLog) end(team, request, sandbox string) (kill bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[createKey{team, request}]
	if e == nil { // never begun: not one of ours
		return false
	}
	e.running, e.at = false, l.now()
	if e.abandoned {
		return sandbox != ""
	}
	e.sandbox = sandbox
	return false
}

// abandon records that the api did not take the answer of a create
// (what it names is the api's: a team and request ID it sent), and
// returns the sandbox it made that is the caller's to kill ("" if none,
// or not yet: a create under way kills what it makes when it ends).
func (l *createLog) abandon(team, request string) (kill string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := createKey{team, request}
	e := l.entries[k]
	if e == nil {
		// Not arrived yet, or forgotten: remembered, so that it is
		// refused if it comes.
		if !l.roomLocked() {
			return ""
		}
		e = &createEntry{at: l.now()}
		l.entries[k] = e
	}
	kill, e.sandbox, e.abandoned = e.sandbox, "", true
	return kill
}

// roomLocked makes room for one more entry: when full, and at least every
// ttl, it forgets the entries that ended more than ttl ago; when still
// full, the oldest that ended. False when every entry is a create under
// way.
func (l *createLog) roomLocked() bool {
	now := l.now()
	if len(l.entries) < l.max && now.Sub(l.lastSweep) < l.ttl {
		return true
	}
	l.lastSweep = now
	var oldest createKey
	var oldestAt time.Time
	cutoff := now.Add(-l.ttl)
	for k, e := range l.entries {
		switch {
		case e.running:
		case e.at.Before(cutoff):
			delete(l.entries, k)
		case oldestAt.IsZero() || e.at.Before(oldestAt):
			oldest, oldestAt = k, e.at
		}
	}
	if len(l.entries) < l.max {
		return true
	}
	if oldestAt.IsZero() {
		return false
	}
	delete(l.entries, oldest)
	return true
}

// errNoRequestID: an AbandonCreate must name the create.
var errNoRequestID = errors.New("a team and a request ID are required")

// create makes the sandbox of a CreateSandbox named request (""
// unnamed), and answers it only when the api may take the answer: what a
// create abandoned meanwhile, or whose caller is gone, made is killed.
func (s service) create(ctx context.Context, request string, cr sandbox.CreateRequest) (*connect.Response[nodev1.CreateSandboxResponse], error) {
	if request != "" {
		if !validRequestID(request) {
			return nil, toConnect(sandboxInvalid("a request ID is 1 to 64 letters, digits, '-' and '_'"))
		}
		if err := s.creates.begin(cr.TeamID.String(), request); err != nil {
			return nil, toConnect(err)
		}
	}
	rec, err := s.m.Create(ctx, cr)
	abandoned := request != "" && s.creates.end(cr.TeamID.String(), request, rec.ID)
	if err != nil {
		return nil, toConnect(err)
	}
	b, err := json.Marshal(rec)
	switch {
	case abandoned:
		err = errAbandoned
	case ctx.Err() != nil:
		err = fmt.Errorf("%w: the api is gone (%v)", sandbox.ErrConflict, context.Cause(ctx))
	}
	if err != nil {
		if request != "" {
			s.creates.abandon(cr.TeamID.String(), request) // a later AbandonCreate has nothing to do
		}
		s.discard(ctx, rec, err)
		return nil, toConnect(err)
	}
	return reply(&nodev1.CreateSandboxResponse{SandboxId: rec.ID, SandboxJson: string(b)}), nil
}

// discard kills a sandbox made for an api that will not take it, whatever
// ctx (the api's call) says.
func (s service) discard(ctx context.Context, rec store.Sandbox, why error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	log := slog.Default()
	tm, err := team.Parse(rec.TeamID) // the call's, which the guard checked
	if err == nil {
		err = s.m.Kill(ctx, tm, rec.ID)
	}
	if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		log.ErrorContext(ctx, "noderpc: killing a sandbox whose create the api did not take failed; it runs until its timeout", "sandbox", rec.ID, "team", rec.TeamID, "why", why, "err", err)
		return
	}
	log.InfoContext(ctx, "noderpc: killed a sandbox whose create the api did not take", "sandbox", rec.ID, "team", rec.TeamID, "why", why)
}

// AbandonCreate kills what the named create made, or has it killed when
// it ends, or refused if it has not begun.
func (s service) AbandonCreate(ctx context.Context, req *connect.Request[nodev1.AbandonCreateRequest]) (*connect.Response[nodev1.AbandonCreateResponse], error) {
	r := req.Msg
	if r.TeamId == "" || !validRequestID(r.RequestId) {
		return nil, toConnect(sandboxInvalid(errNoRequestID.Error()))
	}
	if id := s.creates.abandon(r.TeamId, r.RequestId); id != "" {
		s.discard(ctx, store.Sandbox{ID: id, TeamID: r.TeamId}, errAbandoned)
	}
	return reply(&nodev1.AbandonCreateResponse{}), nil
}
