package runtime

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/mountinfo"
)

func TestParseCgroupMounts(t *testing.T) {
	hybrid := `25 1 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/pids rw,nosuid shared:16 - cgroup cgroup rw,pids
40 1 8:1 / /mnt/with\040space rw - ext4 /dev/sda1 rw
`
	entries, err := mountinfo.Parse(strings.NewReader(hybrid))
	m := cgroupMountsOf(entries)
	if err != nil {
		t.Fatal(err)
	}
	if m.v2 != "/sys/fs/cgroup/unified" {
		t.Errorf("v2 = %q", m.v2)
	}
	if d, v2, ok := m.dir("cpuacct", "/warren/x"); !ok || v2 || d != "/sys/fs/cgroup/cpu,cpuacct/warren/x" {
		t.Errorf("cpuacct dir = %q v2=%v ok=%v", d, v2, ok)
	}
	if d, v2, _ := m.dir("memory", "/warren/x"); v2 || d != "/sys/fs/cgroup/memory/warren/x" {
		t.Errorf("memory dir = %q", d)
	}
	if n := len(m.hierarchies()); n != 5 {
		t.Errorf("hierarchies = %v", m.hierarchies())
	}

	unified := "30 1 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
	entries, _ = mountinfo.Parse(strings.NewReader(unified))
	m = cgroupMountsOf(entries)
	if d, v2, ok := m.dir("pids", "/warren/x"); !ok || !v2 || d != "/sys/fs/cgroup/warren/x" {
		t.Errorf("v2 pids dir = %q v2=%v ok=%v", d, v2, ok)
	}
}

func TestReadStatsV2Files(t *testing.T) {
	root := t.TempDir()
	d := filepath.Join(root, "warren", "x")
	os.MkdirAll(d, 0o755)
	files := map[string]string{
		"cpu.stat":       "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
		"memory.current": "4096\n",
		"memory.max":     "max\n",
		"pids.current":   "3\n",
	}
	for name, c := range files {
		os.WriteFile(filepath.Join(d, name), []byte(c), 0o644)
	}
	st, err := readStats(&cgroupMounts{v1: map[string]string{}, v2: root}, "/warren/x")
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{CPUUsageNs: 1500000, MemoryBytes: 4096, Pids: 3}) {
		t.Errorf("stats = %+v", st)
	}
}

func TestParseCriuVersion(t *testing.T) {
	for out, want := range map[string][2]int{
		"Version: 3.17.1\n":                {3, 17},
		"Version: 4.2\nGitID: v4.2-3-gabc": {4, 2},
		"Version: 4.10.0\n":                {4, 10},
	} {
		ma, mi, ok := parseCriuVersion(out)
		if !ok || ma != want[0] || mi != want[1] {
			t.Errorf("%q: %d.%d %v, want %v", out, ma, mi, ok, want)
		}
	}
	if _, _, ok := parseCriuVersion("criu: command not found"); ok {
		t.Error("parsed garbage")
	}
	if !strings.Contains(errRuncNoCheckpoint.Error(), "checkpoint/restore is not supported by the runc runtime on this host: CRIU >= 4.2 is required") {
		t.Errorf("message: %v", errRuncNoCheckpoint)
	}
}

func TestCriuStatusMissing(t *testing.T) {
	if _, ok, detail := criuStatus("/nonexistent/criu"); ok || !strings.Contains(detail, "4.2") {
		t.Errorf("ok=%v detail=%q", ok, detail)
	}
}

func TestCommandErrors(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "runtime.log")
	os.WriteFile(log, []byte(`{"level":"error","msg":"old failure"}`+"\n"), 0o600)
	off := fileSize(log)
	f, _ := os.OpenFile(log, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"level":"warning","msg":"noise"}` + "\n" + `{"level":"error","msg":"container init failed"}` + "\n")
	f.Close()
	if got := errorsFromLog(log, off); got != "container init failed" {
		t.Errorf("errorsFromLog = %q", got)
	}
	if got := commandName("/usr/sbin/runc", []string{"--root", "/run/x", "--log", "l", "checkpoint", "--image-path", "i", "sb"}); got != "runc checkpoint" {
		t.Errorf("commandName = %q", got)
	}

	// A failing command reports what it said; a hanging one is bounded.
	c := cli{bin: "/bin/sh", timeout: 200 * time.Millisecond}
	_, err := c.run(context.Background(), "sb", call{args: []string{"-c", "echo boom >&2; exit 3"}})
	if err == nil || !strings.Contains(err.Error(), "boom") || !isCommandError(err) {
		t.Errorf("err = %v", err)
	}
	start := time.Now()
	_, err = c.run(context.Background(), "sb", call{args: []string{"-c", "sleep 10"}})
	if err == nil || time.Since(start) > 3*time.Second {
		t.Errorf("hanging command: err=%v after %v", err, time.Since(start))
	}
}

func TestEnsureRunscUpToDateSkipsBuild(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "runsc"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "runsc.version"), []byte(runscStamp), 0o644)
	start := time.Now()
	p, err := EnsureRunsc(context.Background(), dir, nil)
	if err != nil || p != filepath.Join(dir, "runsc") || time.Since(start) > time.Second {
		t.Errorf("EnsureRunsc = %q %v (%v)", p, err, time.Since(start))
	}
}

func TestCheckStatic(t *testing.T) {
	if err := checkStatic("/bin/sh"); err == nil {
		// Debian's /bin/sh (dash) is dynamically linked.
		t.Error("checkStatic accepted a dynamic binary")
	}
}

func TestFindGo(t *testing.T) {
	t.Setenv("PATH", "/nonexistent")
	if p, err := findGo(); err != nil {
		if _, serr := os.Stat("/usr/local/go/bin/go"); serr == nil {
			t.Errorf("findGo missed /usr/local/go/bin/go: %v", err)
		}
	} else if !strings.HasSuffix(p, "/go") {
		t.Errorf("findGo = %q", p)
	}
}

// RunscFlags come after Warren's own flags and the log flags, so that
// they override them, and each must be one --name[=value] argument.
func TestRunscFlags(t *testing.T) {
	cfg, err := Config{RunscFlags: []string{"--debug-log=", "--directfs=false"}}.withDefaults("runsc")
	if err != nil {
		t.Fatal(err)
	}
	r := &Runsc{base: &base{cfg: cfg}}
	got := r.global("sb1")
	if n := len(got); n < 3 || got[n-2] != "--debug-log=" || got[n-1] != "--directfs=false" {
		t.Errorf("global flags = %q, want the configured ones last", got)
	}
	if !slices.Contains(got, "--platform=systrap") {
		t.Errorf("global flags = %q lost Warren's own", got)
	}
	for _, bad := range []string{"directfs=false", "-debug", "--debug-log /tmp/x", "--a\nb"} {
		if _, err := (Config{RunscFlags: []string{bad}}).withDefaults("runsc"); err == nil {
			t.Errorf("runsc flag %q: no error", bad)
		}
	}
}

// copyTree copies a read-only module tree into a writable one, and
// refuses what is neither a file nor a directory.
func TestCopyTree(t *testing.T) {
	from := filepath.Join(t.TempDir(), "mod")
	if err := os.MkdirAll(filepath.Join(from, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(from, "a", "b", "f.go"), []byte("package b\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(from, "a", "b"), 0o555); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "copy")
	if err := copyTree(from, to); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(to, "a", "b", "f.go"))
	if err != nil || string(got) != "package b\n" {
		t.Fatalf("copied file: %q %v", got, err)
	}
	for _, p := range []string{filepath.Join(to, "a", "b"), filepath.Join(to, "a", "b", "f.go")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o200 == 0 {
			t.Errorf("%s is not writable by its owner: %v", p, fi.Mode())
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(from, "link")); err == nil {
		if err := copyTree(from, filepath.Join(t.TempDir(), "copy2")); err == nil {
			t.Error("a symlink was copied")
		}
	}
}
