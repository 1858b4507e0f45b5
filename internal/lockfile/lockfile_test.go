package lockfile

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestAcquireExcludesAndReleases(t *testing.T) {
	p := filepath.Join(t.TempDir(), "l")
	release, err := Acquire(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := Acquire(ctx, p); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Acquire while held: %v", err)
	}
	release()
	r2, err := Acquire(context.Background(), p)
	if err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
	r2()
}
