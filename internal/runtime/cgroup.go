package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/poll"
)

// cgroupMounts says where the cgroup hierarchies are mounted. A host is
// v1 (a hierarchy per controller or group of them), v2 (one unified
// hierarchy) or hybrid (v1 controllers plus an unified mount, usually
// without controllers). For each controller the v1 hierarchy wins when it
// exists, because that is where runtimes set limits on a hybrid host.
type cgroupMounts struct {
	v1 map[string]string // controller (or "name=xyz") -> mount point
	v2 string            // unified mount point, "" if none
}

func readCgroupMounts() (*cgroupMounts, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	return cgroupMountsOf(mounts), nil
}

func cgroupMountsOf(mounts []mountinfo.Entry) *cgroupMounts {
	m := &cgroupMounts{v1: map[string]string{}}
	for _, e := range mounts {
		switch e.FSType {
		case "cgroup2":
			if m.v2 == "" {
				m.v2 = e.MountPoint
			}
		case "cgroup":
			for _, opt := range e.SuperOptions {
				switch opt {
				case "rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "clone_children", "xattr", "noprefix", "cpuset_v2_mode":
					continue
				}
				if _, dup := m.v1[opt]; !dup {
					m.v1[opt] = e.MountPoint
				}
			}
		}
	}
	return m
}

// dir returns the directory of cgroup path cg for controller ctrl, and
// whether it is a v2 directory. ok is false when the controller is
// nowhere to be found.
func (m *cgroupMounts) dir(ctrl, cg string) (dir string, v2, ok bool) {
	if mnt, ok := m.v1[ctrl]; ok {
		return filepath.Join(mnt, cg), false, true
	}
	if m.v2 != "" {
		return filepath.Join(m.v2, cg), true, true
	}
	return "", false, false
}

// hierarchies lists every mounted hierarchy once.
func (m *cgroupMounts) hierarchies() []string {
	var out []string
	for _, mnt := range m.v1 {
		if !slices.Contains(out, mnt) {
			out = append(out, mnt)
		}
	}
	if m.v2 != "" && !slices.Contains(out, m.v2) {
		out = append(out, m.v2)
	}
	return out
}

// readStats reads a sandbox's usage from cgroup path cg.
func readStats(m *cgroupMounts, cg string) (Stats, error) {
	var st Stats
	var errs []error
	if d, v2, ok := m.dir("cpuacct", cg); ok {
		var err error
		if v2 {
			var usec uint64
			usec, err = readKeyed(filepath.Join(d, "cpu.stat"), "usage_usec")
			st.CPUUsageNs = usec * 1000
		} else {
			st.CPUUsageNs, err = readUint(filepath.Join(d, "cpuacct.usage"))
		}
		errs = append(errs, err)
	}
	if d, v2, ok := m.dir("memory", cg); ok {
		cur, lim := "memory.usage_in_bytes", "memory.limit_in_bytes"
		if v2 {
			cur, lim = "memory.current", "memory.max"
		}
		var err error
		st.MemoryBytes, err = readUint(filepath.Join(d, cur))
		errs = append(errs, err)
		cacheKey := "cache"
		if v2 {
			cacheKey = "file"
		}
		// Best effort: memory.stat lacks nothing the sandbox needs.
		st.MemoryCacheBytes, _ = readKeyed(filepath.Join(d, "memory.stat"), cacheKey)
		if l, err := readUint(filepath.Join(d, lim)); err == nil && l < 1<<62 {
			st.MemoryLimitBytes = l // v1 reports "unlimited" as a huge number
		}
	}
	if d, _, ok := m.dir("pids", cg); ok {
		var err error
		st.Pids, err = readUint(filepath.Join(d, "pids.current"))
		errs = append(errs, err)
	}
	return st, errors.Join(errs...)
}

func readUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 1 << 63, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// readKeyed reads "key value" lines (cpu.stat, memory.stat).
func readKeyed(p, key string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %q", p, key)
}

// removeCgroups removes cgroup path cg (and anything below it) from every
// hierarchy. Runtimes remove their cgroups themselves, but not always
// (runsc left some behind without cgroupsPath; a killed runtime leaves
// all), and a leftover cgroup with the same name would hand its limits and
// its frozen state to the next sandbox with that ID. rmdir fails with EBUSY
// while dying tasks are still being torn down, so it retries until ctx is
// done.
func removeCgroups(ctx context.Context, m *cgroupMounts, cg string) error {
	var errs []error
	for _, h := range m.hierarchies() {
		if err := removeCgroupTree(ctx, filepath.Join(h, cg)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeCgroupTree(ctx context.Context, dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroupTree(ctx, filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	var last error
	err = poll.Backoff(ctx, time.Millisecond, 50*time.Millisecond, func(context.Context) (bool, error) {
		last = os.Remove(dir)
		return last == nil || errors.Is(last, fs.ErrNotExist), nil
	})
	if err != nil {
		return fmt.Errorf("removing cgroup %s: %w", dir, last)
	}
	return nil
}

// cgroupLeftovers lists the directories of cgroup path cg that exist.
func cgroupLeftovers(m *cgroupMounts, cg string) []string {
	var found []string
	for _, h := range m.hierarchies() {
		if _, err := os.Stat(filepath.Join(h, cg)); err == nil {
			found = append(found, filepath.Join(h, cg))
		}
	}
	return found
}
