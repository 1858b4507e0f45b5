package hostres

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	tot, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if tot.CPUs < 1 || tot.MemoryMB < 64 {
		t.Errorf("implausible totals %+v", tot)
	}
}

func TestMemTotal(t *testing.T) {
	kb, err := memTotalKB(strings.NewReader("MemFree: 5 kB\nMemTotal:       24684084 kB\n"))
	if err != nil || kb != 24684084 {
		t.Errorf("%d %v", kb, err)
	}
	for _, bad := range []string{"", "MemTotal: 12\n", "MemTotal: x kB\n", "MemTotal: 1 MB\n"} {
		if _, err := memTotalKB(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestFreeMB(t *testing.T) {
	free, err := FreeMB(t.TempDir())
	if err != nil || free <= 0 {
		t.Errorf("%d %v", free, err)
	}
	if _, err := FreeMB("/does/not/exist"); err == nil {
		t.Error("no error for a missing path")
	}
}

func TestRaisePidMax(t *testing.T) {
	f := filepath.Join(t.TempDir(), "pid_max")
	for _, c := range []struct {
		had, want, is int
	}{{32768, 4 << 20, 4 << 20}, {4 << 20, 32768, 4 << 20}, {100000, 100000, 100000}} {
		if err := os.WriteFile(f, []byte(strconv.Itoa(c.had)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		was, is, err := RaisePidMax(f, c.want)
		got, _ := os.ReadFile(f)
		if err != nil || was != c.had || is != c.is || strings.TrimSpace(string(got)) != strconv.Itoa(c.is) {
			t.Errorf("had %d, want %d: was %d, is %d, file %q, %v", c.had, c.want, was, is, got, err)
		}
	}
	if err := os.WriteFile(f, []byte("lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RaisePidMax(f, 10); err == nil {
		t.Error("a pid_max that is no number: no error")
	}
}

// A sparse file counts what it holds, a hard link once, a missing path
// nothing.
func TestAllocatedBytes(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(1 << 30)
	f.WriteAt(make([]byte, 1<<20), 0)
	f.Sync()
	f.Close()
	os.MkdirAll(filepath.Join(dir, "sub"), 0o700)
	os.WriteFile(filepath.Join(dir, "sub", "data"), make([]byte, 1<<20), 0o600)
	os.Link(filepath.Join(dir, "sub", "data"), filepath.Join(dir, "sub", "link"))
	os.Symlink("/usr", filepath.Join(dir, "usr"))
	got, err := AllocatedBytes(dir, filepath.Join(dir, "missing"))
	if err != nil {
		t.Fatal(err)
	}
	if got < 2<<20 || got > 3<<20 {
		t.Errorf("AllocatedBytes = %d, want about 2 MiB", got)
	}
}
