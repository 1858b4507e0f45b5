package baseimage

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/warren-sandbox/warren/internal/image"
)

// The base recipe. Changing anything here means bumping baseRecipe.
const (
	debianSuite = "bookworm"
	// chrootPath is the PATH inside the chroot: the host's may name
	// directories the new system lacks.
	chrootPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// basePackages are installed into the Debian minbase system.
var basePackages = []string{
	"bash", "ca-certificates", "curl", "git", "iproute2", "nodejs", "npm",
	"procps", "python3", "python-is-python3", "sudo",
}

// buildDebian builds the base layer into dir: debootstrap (minbase), the
// packages, the user `user`, then removes what only the build needed.
// No /proc is mounted in the chroot: none of the packages' maintainer
// scripts need it, and a mount is one more thing a crash could leave.
func buildDebian(ctx context.Context, dir string, opts Options, step image.StepFunc, progress io.Writer) error {
	if err := ensureDebootstrap(ctx, step, progress); err != nil {
		return err
	}
	mirror := opts.Mirror
	if mirror == "" {
		var err error
		if mirror, err = aptMirror(); err != nil {
			return err
		}
	}
	step("debootstrap --variant=minbase %s from %s", debianSuite, mirror)
	if err := run(ctx, progress, nil, "debootstrap", "--variant=minbase", debianSuite, dir, mirror); err != nil {
		return fmt.Errorf("baseimage: debootstrap: %w", err)
	}

	// The build resolves names with the host's resolver; the file is
	// emptied afterwards because sandboxes get theirs from the runtime.
	if err := copyFile("/etc/resolv.conf", filepath.Join(dir, "etc/resolv.conf"), 0o644); err != nil {
		return err
	}
	// Keep maintainer scripts from starting services in the chroot.
	policy := filepath.Join(dir, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	env := []string{"PATH=" + chrootPath, "HOME=/root", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
	chroot := func(args ...string) error {
		return run(ctx, progress, env, "chroot", append([]string{dir}, args...)...)
	}

	step("apt-get install %s", strings.Join(basePackages, " "))
	if err := chroot("apt-get", "update", "-q"); err != nil {
		return fmt.Errorf("baseimage: apt-get update in the base: %w", err)
	}
	install := append([]string{"apt-get", "install", "-y", "-q", "--no-install-recommends"}, basePackages...)
	if err := chroot(install...); err != nil {
		return fmt.Errorf("baseimage: installing packages in the base: %w", err)
	}

	step("adding user 'user' (uid 1000) with passwordless sudo")
	if err := chroot("groupadd", "--gid", "1000", "user"); err != nil {
		return fmt.Errorf("baseimage: groupadd: %w", err)
	}
	if err := chroot("useradd", "--create-home", "--home-dir", "/home/user", "--uid", "1000", "--gid", "1000",
		"--shell", "/bin/bash", "user"); err != nil {
		return fmt.Errorf("baseimage: useradd: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/sudoers.d/user"), []byte("user ALL=(ALL:ALL) NOPASSWD:ALL\n"), 0o440); err != nil {
		return err
	}

	step("cleaning up")
	if err := chroot("apt-get", "clean"); err != nil {
		return err
	}
	files := map[string]string{
		"etc/hostname":    "sandbox\n",
		"etc/hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n",
		"etc/resolv.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	if err := os.Remove(policy); err != nil {
		return err
	}
	// Every SDK command runs in `bash -l`, and Debian's /etc/profile asks
	// `$(id -u)` twice: under gVisor (systrap) each fork and exec costs
	// about 20 ms, which doubled a command's round trip. bash knows its
	// EUID; sh, which lacks it, still runs id.
	profile := filepath.Join(dir, "etc/profile")
	data, err := os.ReadFile(profile)
	if err != nil {
		return err
	}
	if err := os.WriteFile(profile, []byte(strings.ReplaceAll(string(data), `"$(id -u)"`, `"${EUID:-$(id -u)}"`)), 0o644); err != nil {
		return err
	}
	// apt's lists and caches are 40+ MB that every sandbox would carry;
	// `apt-get update` in a sandbox brings back what it needs.
	for _, pattern := range []string{"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/log/apt/*", "var/log/dpkg.log", "var/cache/debconf/*-old", "root/.bash_history"} {
		matches, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, m := range matches {
			if filepath.Base(m) == "partial" || filepath.Base(m) == "lock" {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	return nil
}

// ensureDebootstrap installs debootstrap with apt-get if it is missing.
func ensureDebootstrap(ctx context.Context, step image.StepFunc, progress io.Writer) error {
	if _, err := exec.LookPath("debootstrap"); err == nil {
		return nil
	}
	step("installing debootstrap")
	install := []string{"install", "-y", "-q", "--no-install-recommends", "debootstrap"}
	if err := run(ctx, progress, nil, "apt-get", install...); err == nil {
		return nil
	}
	// Perhaps the package lists are missing or stale.
	if err := run(ctx, progress, nil, "apt-get", "update", "-q"); err != nil {
		return fmt.Errorf("baseimage: apt-get update: %w", err)
	}
	if err := run(ctx, progress, nil, "apt-get", install...); err != nil {
		return fmt.Errorf("baseimage: installing debootstrap: %w", err)
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	_ = os.Remove(dst) // may be a dangling symlink
	return os.WriteFile(dst, b, mode)
}
