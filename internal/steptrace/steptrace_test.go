package steptrace

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestMarkRecordsStepsInOrder(t *testing.T) {
	tr := New()
	ctx := With(context.Background(), tr)
	time.Sleep(2 * time.Millisecond)
	From(ctx).Mark("first")
	From(ctx).Mark("second")
	steps := tr.Steps()
	if len(steps) != 2 || steps[0].Name != "first" || steps[1].Name != "second" {
		t.Fatalf("steps = %+v", steps)
	}
	if steps[0].D < 2*time.Millisecond {
		t.Errorf("first step took %v, slept 2ms in it", steps[0].D)
	}
	s := tr.String()
	if !strings.HasPrefix(s, "first=") || !strings.Contains(s, ",second=") {
		t.Errorf("String() = %q", s)
	}
}

func TestNoTraceInContextIsANoOp(t *testing.T) {
	tr := From(context.Background())
	if tr != nil {
		t.Fatal("a bare context has a trace")
	}
	tr.Mark("x") // must not panic
	if tr.Steps() != nil || tr.String() != "" {
		t.Error("a nil trace has steps")
	}
}
