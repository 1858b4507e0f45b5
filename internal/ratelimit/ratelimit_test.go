package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestAllowRefillsAtTheRate(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	k := &Keyed{Rate: 2, Burst: 4, Now: c.now}
	for i := range 4 {
		if ok, _ := k.Allow("team"); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, wait := k.Allow("team")
	if ok || wait <= 0 || wait > 500*time.Millisecond {
		t.Fatalf("past the burst: ok=%v wait=%v, want refused with a wait of at most 0.5 s", ok, wait)
	}
	if ok, _ := k.Allow("other"); !ok {
		t.Error("another key shares the bucket")
	}
	c.advance(wait)
	if ok, _ := k.Allow("team"); !ok {
		t.Error("refused after the announced wait")
	}
}

func TestSpendAndBlocked(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	k := &Keyed{Rate: 1, Burst: 2, Now: c.now}
	if blocked, _ := k.Blocked("1.2.3.4"); blocked {
		t.Fatal("an unknown key is blocked")
	}
	k.Spend("1.2.3.4")
	if blocked, _ := k.Blocked("1.2.3.4"); blocked {
		t.Fatal("blocked with a token left")
	}
	k.Spend("1.2.3.4")
	blocked, wait := k.Blocked("1.2.3.4")
	if !blocked || RetryAfter(wait) != 1 {
		t.Fatalf("after the burst: blocked=%v wait=%v", blocked, wait)
	}
	c.advance(time.Second)
	if blocked, _ := k.Blocked("1.2.3.4"); blocked {
		t.Error("still blocked after a refill")
	}
}

func TestKeysAreBounded(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	k := &Keyed{Rate: 1, Burst: 1, MaxKeys: 10, Now: c.now}
	for i := range 1000 {
		k.Spend(fmt.Sprint("10.0.0.", i))
		c.advance(time.Millisecond)
	}
	if n := len(k.buckets); n > 10 {
		t.Errorf("%d buckets kept, the bound is 10", n)
	}
	// The most recent spender is still held back.
	if blocked, _ := k.Blocked("10.0.0.999"); !blocked {
		t.Error("the newest key lost its bucket")
	}
}

func TestClientKey(t *testing.T) {
	for in, want := range map[string]string{
		"1.2.3.4:5678":               "1.2.3.4",
		"[::ffff:1.2.3.4]:80":        "1.2.3.4",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:443": "2001:db8:1:2::/64",
		"[fe80::1%eth0]:1":           "fe80::/64",
		"not an address":             "not an address",
	} {
		if got := ClientKey(in); got != want {
			t.Errorf("ClientKey(%q) = %q, want %q", in, got, want)
		}
	}
	if RetryAfter(1500*time.Millisecond) != 2 || RetryAfter(0) != 1 {
		t.Error("RetryAfter rounds up to whole seconds, at least 1")
	}
}
