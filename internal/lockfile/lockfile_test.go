package lockfile

import (
	"context"
	"errors"
	"os"
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

func TestTryAcquireNamesTheHolder(t *testing.T) {
	p := filepath.Join(t.TempDir(), "l")
	release, _, err := TryAcquire(p, "pid 1 of data dir /a")
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to the open file: a second open, even in this
	// process, is refused as another process would be.
	if _, holder, err := TryAcquire(p, "pid 2"); !errors.Is(err, ErrHeld) || holder != "pid 1 of data dir /a" {
		t.Fatalf("second TryAcquire while held: %v, holder %q", err, holder)
	}
	release()
	r2, last, err := TryAcquire(p, "pid 2")
	if err != nil || last != "pid 1 of data dir /a" {
		t.Fatalf("after release: %v, last holder %q", err, last)
	}
	r2()
	// A link planted at the lock's name is not followed.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if _, _, err := TryAcquire(link, "x"); err == nil {
		t.Error("TryAcquire followed a symlink")
	}
}
