package hostres

import (
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
