package network

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// TestCheckRangeFree: a range is free for its own prefix (a previous run's
// routes and addresses are its own), and taken for any other prefix whose
// range overlaps it, the way a second warren serve would be refused.
func TestCheckRangeFree(t *testing.T) {
	m := newTestManager(t, Config{PoolSize: -1})
	s, err := m.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(s)
	ours := netip.MustParsePrefix(testCIDR)
	if err := CheckRangeFree(ours, testPrefix); err != nil {
		t.Errorf("own range with a slot out: %v", err)
	}
	for _, c := range []struct {
		cidr, prefix string
	}{
		{testCIDR, "wtsu"},            // the same range, another server
		{"10.123.0.0/17", "wtsu"},     // a part of it
		{"10.122.0.0/15", "wtsu"},     // a range around it
		{"10.123.0.0/17", testPrefix}, // even its own prefix: the unreachable route is for /16
	} {
		err := CheckRangeFree(netip.MustParsePrefix(c.cidr), c.prefix)
		if err == nil || !strings.Contains(err.Error(), "--network-cidr") {
			t.Errorf("%s for %s: %v, want refused", c.cidr, c.prefix, err)
		}
	}
	if err := CheckRangeFree(netip.MustParsePrefix("10.219.0.0/16"), "wtsu"); err != nil {
		t.Errorf("an unused range: %v", err)
	}
}
