package egress

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

type countingResolver struct {
	answers fakeResolver
	lookups atomic.Int64
}

func (r *countingResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	return r.answers.LookupNetIP(ctx, network, host)
}

// A name is looked up once per nameTTL, and what the node refuses is
// dropped from cached answers too.
func TestResolveCachesNames(t *testing.T) {
	pub, priv := netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("10.0.0.2")
	r := &countingResolver{answers: fakeResolver{"a.test": {pub, priv}}}
	refused := map[netip.Addr]bool{priv: true}
	d := &dialer{resolver: r, timeout: time.Second, refused: func(a netip.Addr) bool { return refused[a] }}
	for range 3 {
		got, err := d.resolve(context.Background(), "a.test")
		if err != nil || len(got) != 1 || got[0] != pub {
			t.Fatalf("resolve: %v %v", got, err)
		}
	}
	if n := r.lookups.Load(); n != 1 {
		t.Errorf("%d lookups for 3 resolves within the TTL", n)
	}
	refused[pub] = true
	if got, err := d.resolve(context.Background(), "a.test"); err == nil || len(got) != 0 {
		t.Errorf("a cached answer let through an address the node now refuses: %v", got)
	}
	d.names.entries["a.test"] = cachedName{addrs: []netip.Addr{pub}, until: time.Now().Add(-time.Second)}
	d.resolve(context.Background(), "a.test")
	if n := r.lookups.Load(); n != 2 {
		t.Errorf("an expired entry was used: %d lookups", n)
	}
}
