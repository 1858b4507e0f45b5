package sandbox

import (
	"context"
	"log/slog"
	"testing"
)

// The production build has no fault points: the environment that makes a
// test build exit (faults_on.go) changes nothing in it. (Were it
// honoured, this test's process would exit with 137.)
func TestNoFaultPointsInProductionBuild(t *testing.T) {
	if faultsBuilt {
		t.Skip("this is the test build with the fault points (-tags warren_faults)")
	}
	t.Setenv("WARREN_TEST_FAULTS", "1")
	t.Setenv("WARREN_TEST_FAULT", "pause-before-upload:*,pause-mid-upload:*")
	m := &Manager{log: slog.Default()}
	m.faultPoint("pause-before-upload", "sb1")
	ctx := context.Background()
	if m.uploadFaults(ctx, "sb1") != ctx {
		t.Fatal("the production build watches uploads for fault points")
	}
}
