package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/lockfile"
)

// BaseTemplateID is the template every sandbox uses unless told otherwise.
const BaseTemplateID = "base"

// baseRecipe names the recipe below; change it whenever the recipe changes
// so that `warren setup` rebuilds the base on machines that have an old one.
const baseRecipe = "debian-bookworm-v1"

// basePackages are installed into the Debian minbase system.
var basePackages = []string{
	"bash", "ca-certificates", "curl", "git", "iproute2", "nodejs", "npm",
	"procps", "python3", "sudo",
}

// BaseOptions configures EnsureBase.
type BaseOptions struct {
	// Mirror is the Debian mirror; default: the first one in this machine's
	// apt sources.
	Mirror string
}

// EnsureBase builds the base template (Debian 12 with python3, nodejs,
// git, curl, sudo and the user `user`, uid 1000, with passwordless sudo)
// unless a complete one of the current recipe exists. It is idempotent and
// safe to call concurrently; progress lines go to progress.
func (s *Store) EnsureBase(ctx context.Context, opts BaseOptions, progress io.Writer) (*Template, error) {
	if progress == nil {
		progress = io.Discard
	}
	if t, err := s.Template(BaseTemplateID); err == nil && t.Recipe == baseRecipe {
		if _, err := s.LayerDirs(t); err == nil {
			return t, nil
		}
	}
	unlock, err := lockfile.Acquire(ctx, filepath.Join(s.dir, ".base.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Someone else may have built it while we waited for the lock.
	if t, err := s.Template(BaseTemplateID); err == nil && t.Recipe == baseRecipe {
		if _, err := s.LayerDirs(t); err == nil {
			return t, nil
		}
	}
	layerID := "base-" + baseRecipe
	final := s.LayerDir(layerID)
	if err := os.RemoveAll(final); err != nil {
		return nil, err
	}
	build := filepath.Join(s.dir, "layers", ".build-"+layerID)
	if err := removeTree(build); err != nil {
		return nil, fmt.Errorf("image: removing an interrupted build: %w", err)
	}
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(progress, "[base %5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	if err := buildBase(ctx, build, opts, step, progress); err != nil {
		_ = removeTree(build)
		return nil, err
	}
	if err := os.Rename(build, final); err != nil {
		_ = removeTree(build)
		return nil, err
	}
	t := &Template{ID: BaseTemplateID, Layers: []string{layerID}, User: "user", Workdir: "/home/user", Recipe: baseRecipe}
	if err := s.PutTemplate(t); err != nil {
		return nil, err
	}
	step("base template ready")
	return t, nil
}

func buildBase(ctx context.Context, dir string, opts BaseOptions, step func(string, ...any), progress io.Writer) error {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		step("installing debootstrap")
		if err := run(ctx, progress, "apt-get", "install", "-y", "-q", "--no-install-recommends", "debootstrap"); err != nil {
			if err2 := run(ctx, progress, "apt-get", "update", "-q"); err2 != nil {
				return fmt.Errorf("image: apt-get update: %w", err2)
			}
			if err := run(ctx, progress, "apt-get", "install", "-y", "-q", "--no-install-recommends", "debootstrap"); err != nil {
				return fmt.Errorf("image: installing debootstrap: %w", err)
			}
		}
	}
	mirror := opts.Mirror
	if mirror == "" {
		var err error
		if mirror, err = aptMirror(); err != nil {
			return err
		}
	}
	step("debootstrap bookworm from %s", mirror)
	if err := run(ctx, progress, "debootstrap", "--variant=minbase", "bookworm", dir, mirror); err != nil {
		return fmt.Errorf("image: debootstrap: %w", err)
	}
	if err := copyFile("/etc/resolv.conf", filepath.Join(dir, "etc/resolv.conf")); err != nil {
		return err
	}
	procDir := filepath.Join(dir, "proc")
	if err := unix.Mount("proc", procDir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("image: mounting /proc in the chroot: %w", err)
	}
	defer unix.Unmount(procDir, unix.MNT_DETACH)
	step("installing %s", strings.Join(basePackages, " "))
	chroot := func(args ...string) error {
		return run(ctx, progress, "chroot", append([]string{dir}, args...)...)
	}
	if err := chroot("apt-get", "update", "-q"); err != nil {
		return fmt.Errorf("image: apt-get update in the base: %w", err)
	}
	install := append([]string{"env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", "--no-install-recommends"}, basePackages...)
	if err := chroot(install...); err != nil {
		return fmt.Errorf("image: installing packages in the base: %w", err)
	}
	step("adding user 'user' (uid 1000) with passwordless sudo")
	if err := chroot("useradd", "--create-home", "--uid", "1000", "--user-group", "--shell", "/bin/bash", "user"); err != nil {
		return fmt.Errorf("image: useradd: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/sudoers.d/user"), []byte("user ALL=(ALL) NOPASSWD:ALL\n"), 0o440); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/hostname"), []byte("sandbox\n"), 0o644); err != nil {
		return err
	}
	step("cleaning apt caches")
	if err := chroot("apt-get", "clean"); err != nil {
		return err
	}
	for _, p := range []string{"var/lib/apt/lists", "var/cache/apt"} {
		entries, _ := os.ReadDir(filepath.Join(dir, p))
		for _, e := range entries {
			if e.Name() != "partial" {
				_ = os.RemoveAll(filepath.Join(dir, p, e.Name()))
			}
		}
	}
	return nil
}

// aptMirror reads the first Debian mirror from the machine's apt sources.
func aptMirror() (string, error) {
	if b, err := os.ReadFile("/etc/apt/sources.list.d/debian.sources"); err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "URIs:"); ok {
				if f := strings.Fields(v); len(f) > 0 && !strings.Contains(f[0], "security") {
					return f[0], nil
				}
			}
		}
	}
	if b, err := os.ReadFile("/etc/apt/sources.list"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == "deb" && !strings.Contains(line, "security") {
				for _, x := range f[1:] {
					if strings.HasPrefix(x, "http") {
						return x, nil
					}
				}
			}
		}
	}
	return "", errors.New("image: no Debian mirror in /etc/apt/sources.list(.d); pass --mirror")
}

func run(ctx context.Context, progress io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = progress
	cmd.Stderr = progress
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	return cmd.Run()
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	_ = os.Remove(dst) // may be a dangling symlink
	return os.WriteFile(dst, b, 0o644)
}

// removeTree unmounts whatever is mounted below dir (an interrupted build
// may have left its /proc) and removes it.
func removeTree(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unmountBelow(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
