package setup

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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

func TestStepOutputKeepsLinesWhole(t *testing.T) {
	for _, logged := range []bool{false, true} {
		var buf, log bytes.Buffer
		r := newReporter(&buf, nil, "")
		if logged {
			r = newReporter(io.Discard, &log, "setup.log")
		}
		var wg sync.WaitGroup
		for _, name := range []string{"a", "b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := r.step(name)
				defer w.Close()
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
		got := buf.String()
		allowed := map[string]bool{"aaaa": true, "bbbb": true, "end-a": true, "end-b": true}
		if logged {
			got = log.String()
			allowed = map[string]bool{"a: aaaa": true, "b: bbbb": true, "a: end-a": true, "b: end-b": true}
		}
		lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
		if len(lines) != 2*400+2 {
			t.Fatalf("logged %v: %d lines", logged, len(lines))
		}
		for _, l := range lines {
			if !allowed[l] {
				t.Fatalf("logged %v: mixed line %q", logged, l)
			}
		}
	}
}

// With a log, progress gets the steps (a template build's own progress
// lines among them), a count of output lines while a step works, and for
// a failed step its last lines and the log's path; the raw output goes to
// the log only.
func TestReporterConcise(t *testing.T) {
	var progress, log bytes.Buffer
	r := newReporter(&progress, &log, "/data/setup.log")
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); r.heartbeat(20*time.Millisecond, stop) }()
	w := r.step("base")
	fmt.Fprintf(w, "[base      0.1s] debootstrap --variant=minbase bookworm\n")
	for i := 0; i < 50; i++ {
		fmt.Fprintf(w, "I: Retrieving package %d\n", i)
	}
	// Until a heartbeat has counted them.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		said := strings.Contains(progress.String(), "base: working, 51 lines of output so far")
		r.mu.Unlock()
		if said {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat counted the lines")
		}
	}
	// A quiet step is said to work every third heartbeat.
	quiet := r.step("runsc")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		said := strings.Contains(progress.String(), "runsc: working, 0 lines of output so far")
		r.mu.Unlock()
		if said {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat said the quiet step works")
		}
	}
	quiet.Close()
	fmt.Fprintf(w, "E: Failed getting release file\nlast words")
	w.Close()
	r.failed(w)
	close(stop)
	<-done

	p := progress.String()
	for _, want := range []string{
		"] base: debootstrap --variant=minbase bookworm\n",
		"] base failed; the last 20 lines of its output (all of it: /data/setup.log):\n",
		"    I: Retrieving package 49\n    E: Failed getting release file\n    last words\n",
	} {
		if !strings.Contains(p, want) {
			t.Errorf("progress lacks %q:\n%s", want, p)
		}
	}
	if strings.Contains(p, "package 30\n") {
		t.Errorf("progress has output beyond the tail:\n%s", p)
	}
	if n := strings.Count(log.String(), "\n"); n != 53 {
		t.Errorf("the log has %d lines, want 53:\n%s", n, log.String())
	}
	if !strings.HasPrefix(log.String(), "base: [base      0.1s] debootstrap") {
		t.Errorf("log starts %q", log.String()[:40])
	}
}

// A real failing step: the base's debootstrap from a mirror that refuses
// connections (a closed port of loopback). Progress names the log, and the
// step's last lines; the raw output is in the log.
func TestRunFailurePrintsLogAndTail(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if testing.Short() {
		t.Skip("runs debootstrap: not in -short (make check)")
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		t.Skip("needs debootstrap (installed by warren setup)") // TestRunIdempotent installs it
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("needs runc (installed by warren setup)")
	}
	dir := t.TempDir()
	logFile := filepath.Join(dir, "setup.log")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	err := Run(ctx, Options{DataDir: filepath.Join(dir, "data"), Runtimes: []string{"runc"}, Mirror: "http://127.0.0.1:9/debian", LogFile: logFile}, &progress)
	if err == nil {
		t.Fatalf("Run succeeded against a closed mirror:\n%s", progress.String())
	}
	if !strings.Contains(err.Error(), logFile) {
		t.Errorf("err %q does not name the log", err)
	}
	p := progress.String()
	t.Logf("progress:\n%s", p)
	if !strings.Contains(p, "base failed; the last ") || !strings.Contains(p, "(all of it: "+logFile+"):") {
		t.Errorf("progress does not name the failed step and the log")
	}
	log, rerr := os.ReadFile(logFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	// debootstrap's own words, in the log and in the printed tail.
	last := strings.TrimPrefix(lastLine(string(log)), "base: ")
	if !strings.Contains(string(log), "base: ") || !strings.Contains(p, "    "+last+"\n") {
		t.Errorf("the tail printed lacks the log's last line %q\nlog:\n%s", last, log)
	}
	if strings.Count(p, "\n") > 40 {
		t.Errorf("progress is not concise: %d lines", strings.Count(p, "\n"))
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
