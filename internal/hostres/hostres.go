// Package hostres reads what this host has for sandboxes: its CPUs and
// memory (read once by whoever admits sandboxes), the free space of a
// file system (read on every request that would fill it), and what a
// tree of files holds of its disk (what a team's paused sandbox or
// template costs).
package hostres

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Totals are a host's CPUs and memory.
type Totals struct {
	CPUs     int
	MemoryMB int
}

// Read returns this host's totals: the CPUs this process may run on and
// MemTotal from /proc/meminfo.
func Read() (Totals, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return Totals{}, err
	}
	defer f.Close()
	kb, err := memTotalKB(f)
	if err != nil {
		return Totals{}, err
	}
	return Totals{CPUs: runtime.NumCPU(), MemoryMB: int(kb / 1024)}, nil
}

// memTotalKB reads the MemTotal line of a /proc/meminfo.
func memTotalKB(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("hostres: unexpected MemTotal line %q", sc.Text())
		}
		return strconv.ParseInt(fields[0], 10, 64)
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("hostres: no MemTotal in /proc/meminfo")
}

// FreeMB is the space an unprivileged writer may still use on the file
// system holding path, in MiB. Root may use the reserved blocks too, but
// those are the margin the node's own processes (the database) keep.
func FreeMB(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("hostres: statfs %s: %w", path, err)
	}
	return int64(st.Bavail) * int64(st.Bsize) >> 20, nil
}

// DiskMB is the size of the file system holding path, in MiB.
func DiskMB(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("hostres: statfs %s: %w", path, err)
	}
	return int64(st.Blocks) * int64(st.Bsize) >> 20, nil
}

// PidMaxWanted is the kernel.pid_max a node raises the host to: the
// kernel's most on 64-bit, and what systemd sets on its hosts. Each idle
// gVisor sandbox holds ~29 host tasks (sentry and gofer threads, systrap
// stubs), so the kernel's default of 32768 stops a node at ~1100
// sandboxes however much memory it has.
const PidMaxWanted = 4 << 20

// RaisePidMax raises the host's kernel.pid_max (a file like
// /proc/sys/kernel/pid_max) to at least want, never lowering it, and
// returns what it was and what it is.
func RaisePidMax(file string, want int) (was, is int, err error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, 0, err
	}
	was, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, 0, fmt.Errorf("hostres: %s holds %q", file, b)
	}
	if was >= want {
		return was, was, nil
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(want)), 0); err != nil {
		return was, was, fmt.Errorf("hostres: raising %s from %d to %d: %w", file, was, want, err)
	}
	return was, want, nil
}

// AllocatedBytes is what the files under paths hold of their file
// systems' blocks (st_blocks, so a sparse file counts what it holds, not
// its size), each inode once. Links are not followed and other file
// systems mounted below a path are not entered; a missing path counts 0.
func AllocatedBytes(paths ...string) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var total int64
	for _, root := range paths {
		var rst unix.Stat_t
		if err := unix.Lstat(root, &rst); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return 0, fmt.Errorf("hostres: %s: %w", root, err)
		}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed meanwhile
				}
				return err
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				if errors.Is(err, unix.ENOENT) {
					return nil
				}
				return err
			}
			if st.Dev != rst.Dev {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if k := (inode{st.Dev, st.Ino}); !seen[k] {
				seen[k] = true
				total += st.Blocks * 512
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("hostres: measuring %s: %w", root, err)
		}
	}
	return total, nil
}
