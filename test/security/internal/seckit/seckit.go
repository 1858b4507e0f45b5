// Package seckit holds what Warren's adversarial suites share
// (test/security, test/security/cluster and test/security/blobstore):
// data dirs that share the installed runsc and base template, free ports,
// the flags of `warren serve`, a command run in a sandbox through a
// proxy, and the checks that a stopped server left nothing behind on the
// machine.
package seckit

import (
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Installed is where `warren setup` put runsc and the base template.
const Installed = "/var/lib/warren"

// FreePort is a loopback TCP port nothing listens on now, below the
// kernel's ephemeral range (32768 and up by default): a port the kernel
// handed out could be taken again by any outgoing connection before the
// server the caller starts binds it.
func FreePort() (int, error) {
	for range 200 {
		port := 20000 + mathrand.IntN(12000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		ln.Close()
		return port, nil
	}
	return 0, errors.New("no free loopback port in 20000-31999")
}

// ServeFlags lists the flags `warren serve` has, from its -h output.
func ServeFlags(warren string) (map[string]bool, error) {
	out, _ := exec.Command(warren, "serve", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["data-dir"] {
		return nil, fmt.Errorf("cannot read the flags of `warren serve -h`:\n%s", out)
	}
	return flags, nil
}

// NewDataDir makes a data dir on a loop-mounted ext4 file system of
// sizeMB (0: a plain directory) that shares the installed runsc and base
// layers (read-only use) but has its own store, credentials, sandboxes
// and templates. The file system's root is left 0755, as mkfs makes it:
// the server is to make it 0700.
func NewDataDir(sizeMB int) (string, error) {
	dir, err := os.MkdirTemp("", "warren-sec-data-")
	if err != nil {
		return "", err
	}
	if sizeMB == 0 {
		return dir, PopulateDataDir(dir)
	}
	img := dir + ".img"
	f, err := os.Create(img)
	if err != nil {
		return "", err
	}
	err = f.Truncate(int64(sizeMB) << 20)
	f.Close()
	if err != nil {
		return "", err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,nodiscard", img).CombinedOutput(); err != nil {
		return "", fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("mount %s: %v: %s", img, err, out)
	}
	os.Remove(filepath.Join(dir, "lost+found"))
	return dir, PopulateDataDir(dir)
}

// PopulateDataDir gives a data dir the installed runsc and base template.
func PopulateDataDir(dir string) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{"bin", "layers", "templates"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Symlink(filepath.Join(Installed, "bin", "runsc"), filepath.Join(dir, "bin", "runsc")); err != nil {
		return err
	}
	base, err := os.ReadFile(filepath.Join(Installed, "templates", "base.json"))
	if err != nil {
		return err
	}
	for _, l := range regexp.MustCompile(`"(base-[A-Za-z0-9_.-]+)"`).FindAllStringSubmatch(string(base), -1) {
		if err := os.Symlink(filepath.Join(Installed, "layers", l[1]), filepath.Join(dir, "layers", l[1])); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "templates", "base.json"), base, 0o644)
}

// MountsBelow lists mount points that start with prefix.
func MountsBelow(prefix string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], prefix) {
			out = append(out, f[4])
		}
	}
	return out
}

// NetnsWithPrefix lists the pinned network namespaces named prefix….
func NetnsWithPrefix(prefix string) []string { return NamesWithPrefix("/var/run/netns", prefix) }

// LinksWithPrefix lists the network interfaces named prefix….
func LinksWithPrefix(prefix string) []string { return NamesWithPrefix("/sys/class/net", prefix) }

// NamesWithPrefix lists the entries of dir whose names begin with prefix.
func NamesWithPrefix(dir, prefix string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// CgroupsBelow lists the cgroups (v2) below parent.
func CgroupsBelow(parent string) []string {
	ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", parent))
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// ProcessesMatching lists the PIDs and commands whose command line holds s.
func ProcessesMatching(s string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	self := strconv.Itoa(os.Getpid())
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
		if strings.Contains(cmd, s) {
			if len(cmd) > 120 {
				cmd = cmd[:120] + "…"
			}
			out = append(out, e.Name()+": "+cmd)
		}
	}
	return out
}
