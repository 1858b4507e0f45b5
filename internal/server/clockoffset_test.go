package server

import (
	"testing"
	"time"
)

// WARREN_TEST_CLOCK_OFFSET: unset is no skew, a Go duration is taken, and
// anything else stops the server rather than running unskewed.
func TestClockOffset(t *testing.T) {
	for _, c := range []struct {
		env     string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false},
		{"90s", 90 * time.Second, false},
		{"-30s", -30 * time.Second, false},
		{"90", 0, true},
		{"soon", 0, true},
	} {
		t.Setenv("WARREN_TEST_CLOCK_OFFSET", c.env)
		got, err := testClockOffset()
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%q: %v %v, want %v (error %v)", c.env, got, err, c.want, c.wantErr)
		}
	}
}
