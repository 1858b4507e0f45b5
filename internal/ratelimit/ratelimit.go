// Package ratelimit keeps token buckets by key (a team, a client
// address) for the API and the proxy, on golang.org/x/time/rate.
//
// The number of keys is bounded: a client spraying addresses must not
// grow the map without end. When it is full, buckets that have refilled
// (whose keys have been quiet long enough to be indistinguishable from
// new ones) are dropped; if none has, the oldest-seen one goes.
package ratelimit

import (
	"math"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// DefaultMaxKeys bounds the keys a Keyed keeps when MaxKeys is 0.
const DefaultMaxKeys = 10000

// Keyed is a set of token buckets, one per key, all with one rate and
// burst. Its methods are safe for concurrent use.
type Keyed struct {
	// Rate is the tokens added per second; Burst the bucket's size.
	Rate  rate.Limit
	Burst int
	// MaxKeys bounds the buckets kept; 0 means DefaultMaxKeys.
	MaxKeys int
	// Now is the clock (tests use a fake one); nil means time.Now.
	Now func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func (k *Keyed) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

// get returns key's bucket, making room for it if needed. k.mu is held.
func (k *Keyed) get(key string, now time.Time) *rate.Limiter {
	if k.buckets == nil {
		k.buckets = map[string]*bucket{}
	}
	b := k.buckets[key]
	if b == nil {
		k.makeRoom(now)
		b = &bucket{lim: rate.NewLimiter(k.Rate, k.Burst)}
		k.buckets[key] = b
	}
	b.seen = now
	return b.lim
}

func (k *Keyed) makeRoom(now time.Time) {
	max := k.MaxKeys
	if max <= 0 {
		max = DefaultMaxKeys
	}
	if len(k.buckets) < max {
		return
	}
	var oldest string
	var oldestSeen time.Time
	for key, b := range k.buckets {
		if b.lim.TokensAt(now) >= float64(k.Burst) {
			delete(k.buckets, key)
			continue
		}
		if oldest == "" || b.seen.Before(oldestSeen) {
			oldest, oldestSeen = key, b.seen
		}
	}
	if len(k.buckets) >= max {
		delete(k.buckets, oldest)
	}
}

// Allow takes a token from key's bucket. When there is none it takes
// nothing and says how long until there is one.
func (k *Keyed) Allow(key string) (ok bool, retryAfter time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	lim := k.get(key, now)
	if lim.AllowN(now, 1) {
		return true, 0
	}
	return false, k.wait(lim, now)
}

// Blocked reports, without taking a token, whether key's bucket is
// empty, and how long until it is not. For budgets that only failures
// spend (see Spend).
func (k *Keyed) Blocked(key string) (bool, time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.buckets[key]
	if b == nil {
		return false, 0
	}
	now := k.now()
	if b.lim.TokensAt(now) >= 1 {
		return false, 0
	}
	return true, k.wait(b.lim, now)
}

// Spend takes a token from key's bucket, if it has one.
func (k *Keyed) Spend(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	k.get(key, now).AllowN(now, 1)
}

// wait is how long until lim has a whole token.
func (k *Keyed) wait(lim *rate.Limiter, now time.Time) time.Duration {
	if k.Rate <= 0 {
		return time.Hour
	}
	missing := 1 - lim.TokensAt(now)
	return time.Duration(missing / float64(k.Rate) * float64(time.Second))
}

// RetryAfter is a wait as the Retry-After header wants it: whole seconds,
// at least 1 (the SDK retries at once on 0).
func RetryAfter(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// ClientKey is the key of a request's client address (http.Request's
// RemoteAddr): the IP, or its /64 for IPv6, where one host holds many.
func ClientKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.WithZone("").Prefix(64)
		return p.String()
	}
	return ip.String()
}
