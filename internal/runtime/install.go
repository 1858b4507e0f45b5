package runtime

import (
	"bufio"
	"context"
	"debug/elf"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
const runscStamp = RunscModule + "@" + RunscVersion + " CGO_ENABLED=0 precompiled-seccomp\n"

// gvisorModule is the module runsc is built from.
const gvisorModule = "gvisor.dev/gvisor"

// seccompGen is the program that writes runsc's precompiled seccomp
// filters into a copy of gVisor's module (seccompgen/main.go.txt says why).
//
//go:embed seccompgen/main.go.txt
var seccompGen []byte

// EnsureRunsc makes sure dir/runsc is the pinned runsc and returns its
// path. If it is missing or was built from another version or another
// way, it builds it from the Go module proxy with its seccomp filters
// precompiled (buildRunsc; 3–5 minutes on 2 cores with a cold module
// cache) and moves it into place atomically. Progress
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

	fmt.Fprintf(progress, "runsc: building %s@%s with %s (CGO_ENABLED=0, precompiled seccomp filters); this takes a few minutes\n", RunscModule, RunscVersion, goBin)
	start := time.Now()
	if err := buildRunsc(ctx, goBin, tmp, progress); err != nil {
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

// buildRunsc builds runsc into tmp/runsc from a copy of gVisor's module
// whose stub of precompiled seccomp filters is replaced by the programs
// themselves (what gVisor's Bazel build does): a sandbox's boot and
// restore then skip compiling them (docs/performance.md, runsc's
// options). The copy is the main module, so its own go.mod and go.sum
// pin every dependency, as `go install runsc@version` would.
func buildRunsc(ctx context.Context, goBin, tmp string, progress io.Writer) error {
	// GOFLAGS is cleared so that a user setting (-mod=vendor...) cannot
	// break the build; GOWORK=off keeps any go.work out.
	env := append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=")
	goCmd := func(dir string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir, cmd.Env = dir, env
		return cmd
	}
	dl := goCmd(tmp, "mod", "download", "-json", gvisorModule+"@"+RunscVersion)
	out, err := dl.Output()
	if err != nil {
		return fmt.Errorf("go mod download %s@%s: %w", gvisorModule, RunscVersion, commandStderr(err))
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return fmt.Errorf("go mod download %s@%s: no module directory in %q (%v %s)", gvisorModule, RunscVersion, out, err, mod.Error)
	}
	src := filepath.Join(tmp, "gvisor")
	if err := copyTree(mod.Dir, src); err != nil {
		return fmt.Errorf("copying %s: %w", mod.Dir, err)
	}
	genDir := filepath.Join(src, "warrenseccompgen")
	if err := os.MkdirAll(genDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(genDir, "main.go"), seccompGen, 0o644); err != nil {
		return err
	}
	filters, err := os.Create(filepath.Join(src, "runsc", "boot", "filter", "filter_precompiled.go"))
	if err != nil {
		return err
	}
	gen := goCmd(src, "run", "./warrenseccompgen")
	gen.Stdout = filters
	var genErr strings.Builder
	gen.Stderr = &genErr
	fmt.Fprintln(progress, "runsc: precompiling the sentry's seccomp filters")
	err = gen.Run()
	if cerr := filters.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("precompiling seccomp filters: %w: %s", err, strings.TrimSpace(genErr.String()))
	}
	fmt.Fprintln(progress, "runsc: "+strings.TrimSpace(genErr.String()))
	return runStreaming(goCmd(src, "build", "-o", filepath.Join(tmp, "runsc"), "./runsc"), progress, "runsc: ")
}

// commandStderr adds a failed command's stderr to its error.
func commandStderr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}

// copyTree copies the directories and regular files under from (a module
// in Go's read-only module cache) to to, writable.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type().IsRegular():
			return copyFile(p, dst)
		default:
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
	})
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
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
