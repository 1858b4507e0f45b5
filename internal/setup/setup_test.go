package setup

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRunIdempotent runs setup on Warren's real data directory, as `make
// test` does: on a fresh machine the first run builds runsc and the base
// (a few minutes); after that a run only checks.
func TestRunIdempotent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if testing.Short() {
		t.Skip("installs runsc and builds templates: not in -short (make check)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, Options{}, &out); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	out.Reset()
	start := time.Now()
	if err := Run(ctx, Options{}, &out); err != nil {
		t.Fatalf("second Run: %v\n%s", err, out.String())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("second Run took %v; it should only check", d)
	}
	t.Logf("second run:\n%s", out.String())
	for _, want := range []string{"runc ready", "runsc ready: " + RunscPath(DefaultDataDir), "base template ready", "] done"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	if fi, err := os.Stat(RunscPath(DefaultDataDir)); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("runsc: %v %v", fi, err)
	}
}

func TestRunRejectsUnknownRuntime(t *testing.T) {
	err := Run(context.Background(), Options{DataDir: t.TempDir(), Runtimes: []string{"crun"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "crun") {
		t.Errorf("err %v", err)
	}
}

func TestLineWriterKeepsLinesWhole(t *testing.T) {
	var buf bytes.Buffer
	out := &syncWriter{w: &buf}
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := out.lines()
			defer w.Flush()
			for i := 0; i < 200; i++ {
				// A line in three writes.
				w.Write([]byte(name + name))
				w.Write([]byte(name + name + "\n" + name))
				w.Write([]byte(name + name + name + "\n"))
			}
			w.Write([]byte("end-" + name))
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 2*400+2 {
		t.Fatalf("%d lines", len(lines))
	}
	for _, l := range lines {
		if l != "aaaa" && l != "bbbb" && l != "end-a" && l != "end-b" {
			t.Fatalf("mixed line %q", l)
		}
	}
}
