// Package setup installs what a Warren node needs, idempotently: the OCI
// runtimes (runsc built from the Go module proxy, runc from Debian) and the
// base template's root filesystem. `warren setup` runs it; `make run` and
// `make test` call that.
//
// What it puts under the data directory (default /var/lib/warren, mode
// 0700 and owned by root: see SecureDataDir):
//
//	bin/runsc, bin/runsc.version   the pinned, static runsc (internal/runtime)
//	layers/, templates/ ...        the base template (internal/baseimage, in internal/image)
//
// What a run says is concise (its steps, elapsed time, a count of each
// working step's output lines); the tools' raw output goes to a log file
// whose path, with a failed step's last lines, a failure prints
// (progress.go).
//
// Every step checks first and does nothing when its result is already in
// place, so a second run takes well under a second. Each step is also safe
// against a concurrent run (lock files), and an interrupted run leaves
// nothing that a later run mistakes for complete.
//
// Background builds the code-interpreter-v1 template while `warren serve
// --build-code-interpreter` serves (what `make run` does, so that base is
// usable without waiting for it), with a state that tells a create of it
// why it is not there yet.
package setup

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/runtime"
)

// DefaultDataDir is where Warren keeps its state.
const DefaultDataDir = "/var/lib/warren"

// Options configures Run.
type Options struct {
	// DataDir is Warren's data directory; default DefaultDataDir.
	DataDir string
	// Mirror overrides the Debian mirror the base is built from (default:
	// the one in this machine's apt sources).
	Mirror string
	// Runtimes to install: "runsc", "runc". Default: both.
	Runtimes []string
	// CodeInterpreter also builds the code-interpreter-v1 template (on
	// top of base; it adds a few minutes on a fresh machine).
	CodeInterpreter bool
	// LogFile, when set, gets the tools' raw output (debootstrap, apt, go
	// build: thousands of lines on a fresh machine), emptied at the start
	// of each run; progress then gets only the steps, every
	// HeartbeatInterval a count of each working step's output lines, and
	// for a failed step its last lines and this path. Empty: progress
	// gets the raw output too.
	LogFile string
	// HeartbeatInterval is how often progress hears of a working step
	// (with LogFile); default 10 s.
	HeartbeatInterval time.Duration
}

// RunscPath is where Run installs runsc for a data directory.
func RunscPath(dataDir string) string { return filepath.Join(dataDir, "bin", "runsc") }

// Run installs whatever is missing and reports progress line by line to
// progress (may be nil).
//
// runc goes first: it is an apt-get install, as is debootstrap's when the
// base needs it, and two apt-gets at once fail on dpkg's lock. Then the
// runsc build (CPU: go install) and the base build (network and disk:
// debootstrap, apt in a chroot) run side by side, which on a fresh machine
// takes about as long as the longer of the two instead of their sum.
func Run(ctx context.Context, opts Options, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	if opts.DataDir == "" {
		opts.DataDir = DefaultDataDir
	}
	if len(opts.Runtimes) == 0 {
		opts.Runtimes = []string{"runsc", "runc"}
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = 10 * time.Second
	}
	var runsc, runc bool
	for _, rt := range opts.Runtimes {
		switch rt {
		case "runsc":
			runsc = true
		case "runc":
			runc = true
		default:
			return fmt.Errorf("setup: unknown runtime %q (want runsc or runc)", rt)
		}
	}
	changed, err := SecureDataDir(opts.DataDir)
	if err != nil {
		return err
	}
	var log io.Writer
	if opts.LogFile != "" {
		f, err := os.OpenFile(opts.LogFile, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("setup: its log: %w", err)
		}
		defer f.Close()
		log = f
	}
	r := newReporter(progress, log, opts.LogFile)
	if opts.LogFile != "" {
		r.say("the tools' output goes to %s", opts.LogFile)
	}
	if changed != "" {
		r.say("data dir %s: %s (only root may enter it)", opts.DataDir, changed)
	}
	store, err := image.Open(opts.DataDir)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if _, err := rootfs.Open(opts.DataDir); err != nil { // its dirs, 0700 like the store's
		return fmt.Errorf("setup: %w", err)
	}
	stopHeartbeat, heartbeatDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(heartbeatDone)
		r.heartbeat(opts.HeartbeatInterval, stopHeartbeat)
	}()
	defer func() { close(stopHeartbeat); <-heartbeatDone }() // nothing is said after Run returns

	if runc {
		if err := ensureRunc(ctx, r); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	// The first failure is the cause; the other half then fails with
	// "context canceled", which is not worth reporting.
	fail := func(out *stepOutput, err error) {
		mu.Lock()
		first := firstErr == nil
		if first {
			firstErr = err
		}
		mu.Unlock()
		cancel()
		if first {
			r.failed(out)
		}
	}
	if runsc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ensureRunsc(ctx, r, opts.DataDir, fail)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		ensureTemplates(ctx, r, store, opts, fail)
	}()
	wg.Wait()
	if firstErr != nil {
		if opts.LogFile != "" {
			return fmt.Errorf("%w (the tools' output: %s)", firstErr, opts.LogFile)
		}
		return firstErr
	}
	r.say("done")
	return nil
}

// ensureRunc installs runc unless it is there.
func ensureRunc(ctx context.Context, r *reporter) error {
	r.say("runc")
	out := r.step("runc")
	p, err := runtime.EnsureRunc(ctx, out)
	out.Close()
	if err != nil {
		r.failed(out)
		return fmt.Errorf("setup: runc: %w", err)
	}
	r.say("runc ready: %s", p)
	return nil
}

// ensureRunsc builds and installs runsc unless it is there.
func ensureRunsc(ctx context.Context, r *reporter, dataDir string, fail func(*stepOutput, error)) {
	r.say("runsc (gVisor)")
	out := r.step("runsc")
	p, err := runtime.EnsureRunsc(ctx, filepath.Dir(RunscPath(dataDir)), out)
	out.Close()
	if err != nil {
		fail(out, fmt.Errorf("setup: runsc: %w", err))
		return
	}
	r.say("runsc ready: %s", p)
}

// ensureTemplates builds base, and code-interpreter-v1 on it if asked,
// unless they are there.
func ensureTemplates(ctx context.Context, r *reporter, store *image.Store, opts Options, fail func(*stepOutput, error)) {
	r.say("base template (Debian 12)")
	out := r.step("base")
	t, err := baseimage.Ensure(ctx, store, baseimage.Options{Mirror: opts.Mirror}, out)
	out.Close()
	if err != nil {
		fail(out, fmt.Errorf("setup: base template: %w", err))
		return
	}
	r.say("base template ready: layers %v", t.Layers)
	if !opts.CodeInterpreter {
		return
	}
	r.say("code-interpreter-v1 template (Jupyter, the Python data libraries, TypeScript, R)")
	out = r.step("code-interpreter-v1")
	t, err = baseimage.EnsureCodeInterpreter(ctx, store, baseimage.Options{Mirror: opts.Mirror}, out)
	out.Close()
	if err != nil {
		fail(out, fmt.Errorf("setup: code-interpreter-v1 template: %w", err))
		return
	}
	r.say("code-interpreter-v1 template ready: layers %v", t.Layers)
}
