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
	start := time.Now()
	out := &syncWriter{w: progress}
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "setup [%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	changed, err := SecureDataDir(opts.DataDir)
	if err != nil {
		return err
	}
	if changed != "" {
		say("data dir %s: %s (only root may enter it)", opts.DataDir, changed)
	}
	store, err := image.Open(opts.DataDir)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if _, err := rootfs.Open(opts.DataDir); err != nil { // its dirs, 0700 like the store's
		return fmt.Errorf("setup: %w", err)
	}

	if runc {
		say("runc")
		p, err := runtime.EnsureRunc(ctx, out)
		if err != nil {
			return fmt.Errorf("setup: runc: %w", err)
		}
		say("runc ready: %s", p)
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
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	if runsc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := out.lines()
			defer w.Flush()
			say("runsc (gVisor)")
			p, err := runtime.EnsureRunsc(ctx, filepath.Dir(RunscPath(opts.DataDir)), w)
			if err != nil {
				fail(fmt.Errorf("setup: runsc: %w", err))
				return
			}
			say("runsc ready: %s", p)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		w := out.lines()
		defer w.Flush()
		say("base template (Debian 12)")
		t, err := baseimage.Ensure(ctx, store, baseimage.Options{Mirror: opts.Mirror}, w)
		if err != nil {
			fail(fmt.Errorf("setup: base template: %w", err))
			return
		}
		say("base template ready: layers %v", t.Layers)
		if !opts.CodeInterpreter {
			return
		}
		say("code-interpreter-v1 template (Jupyter, the Python data libraries, TypeScript, R)")
		t, err = baseimage.EnsureCodeInterpreter(ctx, store, baseimage.Options{Mirror: opts.Mirror}, w)
		if err != nil {
			fail(fmt.Errorf("setup: code-interpreter-v1 template: %w", err))
			return
		}
		say("code-interpreter-v1 template ready: layers %v", t.Layers)
	}()
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	say("done")
	return nil
}
