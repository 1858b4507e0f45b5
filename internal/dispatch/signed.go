package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/proxy"
	"github.com/warren-sandbox/warren/internal/store"
)

// Signed URLs name no sandbox: the only way to tell which one a URL is
// for is to check its signature, SHA-256 over the path, operation, user
// and expiry with the sandbox's envd access token (E2B's scheme), against
// every routable sandbox's token. Nothing a request carries can be looked
// up (the signature depends on the token and on what the client chose),
// so the api keeps every routable sandbox's token in memory and checks
// them there; what it must not do is read them all from the store for
// each request, as an unauthenticated client could make it do at will.
//
// signedIndex is that map, kept in step with the store by the route
// sequence (store.SandboxRoutes): each request reads only the sandboxes
// whose routing changed since the last read, which is one indexed read of
// no rows while nothing changes. A match is confirmed against the
// sandbox's record (one read by key), which also catches a record
// deleted without a state change; the whole map is read again every
// signedResync, which drops any such leftovers that never matched.
type signedIndex struct {
	// sync is held while the store is read, so that reads do not pile
	// up; mu guards the map.
	sync   sync.Mutex
	mu     sync.Mutex
	seq    int64
	loaded time.Time
	tokens map[string]string // sandbox ID → envd access token, routable ones
}

const signedResync = 10 * time.Minute

// refresh brings the index up to date with the store.
func (d *Dispatcher) refreshSigned(ctx context.Context) error {
	x := &d.signed
	x.sync.Lock()
	defer x.sync.Unlock()
	x.mu.Lock()
	seq := x.seq
	if d.cfg.Now().Sub(x.loaded) > signedResync {
		seq = 0
	}
	x.mu.Unlock()
	routes, next, err := d.cfg.Store.SandboxRoutes(ctx, seq)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if seq == 0 {
		x.tokens = make(map[string]string, len(routes))
		x.loaded = d.cfg.Now()
	}
	for _, r := range routes {
		if routableRoute(r) && r.EnvdAccessToken != "" {
			x.tokens[r.ID] = r.EnvdAccessToken
		} else {
			delete(x.tokens, r.ID)
		}
	}
	x.seq = next
	return nil
}

func routableRoute(r store.SandboxRoute) bool {
	return r.State == store.StateRunning || r.State == store.StatePaused && r.AutoResume
}

// SignedBy finds the sandbox whose envd token signed a URL among the
// cluster's routable sandboxes, asking signed of every one (the time
// taken tells nothing of which matched), in memory: the store is read
// for what changed since the last request and, on a match, for the
// matching sandbox's record.
func (d *Dispatcher) SignedBy(signed func(envdAccessToken string) bool) (string, error) {
	ctx := context.Background()
	if err := d.refreshSigned(ctx); err != nil {
		return "", err
	}
	x := &d.signed
	x.mu.Lock()
	cands := make([]proxy.SignedCandidate, 0, len(x.tokens))
	for id, tok := range x.tokens {
		cands = append(cands, proxy.SignedCandidate{ID: id, EnvdAccessToken: tok})
	}
	x.mu.Unlock()
	found, err := proxy.FirstSigned(cands, signed)
	if err != nil {
		return "", err
	}
	rec, err := d.cfg.Store.GetSandbox(ctx, found)
	if err == nil && routable(rec) && signed(rec.EnvdAccessToken) {
		return found, nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	// Deleted (or changed) under the index: forget it until the store
	// says otherwise.
	x.mu.Lock()
	delete(x.tokens, found)
	x.mu.Unlock()
	return "", proxy.ErrNotFound
}
