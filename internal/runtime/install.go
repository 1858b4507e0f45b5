package runtime

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/lockfile"
)

// The runsc that `warren setup` installs. gVisor publishes no tagged Go
// module versions; this pseudo-version (its "go" branch) is what the
// Go module proxy serves and what runtime-facts.md measured.
const (
	RunscModule  = "gvisor.dev/gvisor/runsc"
	RunscVersion = "v0.0.0-20260905035102-160fafc42237"
)

// runscStamp is written next to the binary; a different stamp (another
// version, or a build made another way) means rebuild.
const runscStamp = RunscModule + "@" + RunscVersion + " CGO_ENABLED=0\n"

// EnsureRunsc makes sure dir/runsc is the pinned runsc and returns its
// path. If it is missing or was built from another version, it builds it
// with `go install` from the Go module proxy (about 1–2 minutes on 2 cores
// with a cold module cache) and moves it into place atomically. Progress
// lines go to progress (may be nil). Concurrent callers (setup and tests)
// are serialized by a lock file in dir, so the build happens once.
//
// The build must be static (CGO_ENABLED=0): a cgo build fails at sandbox
// boot, when the sentry re-executes itself inside a chroot that has no
// dynamic loader.
func EnsureRunsc(ctx context.Context, dir string, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "runsc")
	stamp := filepath.Join(dir, "runsc.version")
	unlock, err := lockfile.Acquire(ctx, filepath.Join(dir, ".runsc.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if runscCurrent(bin, stamp) {
		return bin, nil
	}
	goBin, err := findGo()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".runsc-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)

	fmt.Fprintf(progress, "runsc: building %s@%s with %s (CGO_ENABLED=0); this takes a minute or two\n", RunscModule, RunscVersion, goBin)
	start := time.Now()
	cmd := exec.CommandContext(ctx, goBin, "install", RunscModule+"@"+RunscVersion)
	cmd.Dir = tmp // outside any module, so no go.mod or go.work applies
	// GOFLAGS is cleared so that a user setting (-mod=vendor...) cannot
	// break the build.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOBIN="+tmp, "GOWORK=off", "GOFLAGS=")
	if err := runStreaming(cmd, progress, "runsc: "); err != nil {
		return "", fmt.Errorf("building runsc: %w", err)
	}
	built := filepath.Join(tmp, "runsc")
	if err := checkStatic(built); err != nil {
		return "", err
	}
	if err := os.Rename(built, bin); err != nil {
		return "", err
	}
	// The stamp goes last: a crash before it means a rebuild, not a
	// binary trusted without one.
	if err := writeFileAtomic(stamp, []byte(runscStamp)); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "runsc: installed %s in %v\n", bin, time.Since(start).Round(time.Second))
	return bin, nil
}

func runscCurrent(bin, stamp string) bool {
	fi, err := os.Stat(bin)
	if err != nil || fi.Mode()&0o111 == 0 {
		return false
	}
	b, err := os.ReadFile(stamp)
	return err == nil && string(b) == runscStamp
}

// checkStatic refuses a dynamically linked binary (one with an ELF
// interpreter), which would build fine and fail only at sandbox boot.
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("runsc build: %w", err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return errors.New("runsc build is dynamically linked; it must be built with CGO_ENABLED=0")
		}
	}
	return nil
}

// findGo finds the go command: on PATH, else where Go's installers put
// it (setup may run with a minimal PATH, e.g. from sudo or systemd).
func findGo() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	candidates := []string{"/usr/local/go/bin/go", "/usr/lib/go/bin/go"}
	if root := os.Getenv("GOROOT"); root != "" {
		candidates = append([]string{filepath.Join(root, "bin", "go")}, candidates...)
	}
	if home, err := os.UserHomeDir(); err == nil {
		sdks, _ := filepath.Glob(filepath.Join(home, "sdk", "go*", "bin", "go"))
		candidates = append(candidates, sdks...)
	}
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", errors.New("the go command was not found (PATH, /usr/local/go/bin): a Go toolchain is needed to build runsc")
}

// runStreaming runs cmd, copying its output lines to w with a prefix.
func runStreaming(cmd *exec.Cmd, w io.Writer, prefix string) error {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var last []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			fmt.Fprintln(w, prefix+sc.Text())
			last = append(last, sc.Text())
			if len(last) > 20 {
				last = last[1:]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.Join(last, "\n"))
	}
	return nil
}

func writeFileAtomic(p string, data []byte) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// EnsureRunc installs Debian's runc package unless runc is on PATH, and
// returns its path. Recommends are skipped: they pull Debian 12's CRIU,
// which cannot checkpoint on current kernels anyway.
func EnsureRunc(ctx context.Context, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	if p, err := exec.LookPath("runc"); err == nil {
		return p, nil
	}
	apt, err := exec.LookPath("apt-get")
	if err != nil {
		return "", errors.New("runc is not installed and apt-get is not available: install runc with the system's package manager")
	}
	install := func() error {
		cmd := exec.CommandContext(ctx, apt, "install", "-y", "--no-install-recommends", "runc")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return runStreaming(cmd, progress, "runc: ")
	}
	fmt.Fprintln(progress, "runc: installing the Debian package")
	if err := install(); err != nil {
		// A fresh machine may have no package lists yet.
		fmt.Fprintln(progress, "runc: install failed; updating package lists and retrying")
		upd := exec.CommandContext(ctx, apt, "update")
		if uerr := runStreaming(upd, progress, "runc: "); uerr != nil {
			return "", fmt.Errorf("apt-get update: %w", uerr)
		}
		if err := install(); err != nil {
			return "", fmt.Errorf("apt-get install runc: %w", err)
		}
	}
	return exec.LookPath("runc")
}
