package mountinfo

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := `22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 22 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
40 1 7:0 / /var/lib/with\040space rw - ext4 /dev/loop0 rw,noatime
garbage line
`
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d entries: %+v", len(got), got)
	}
	if got[1].FSType != "cgroup" || got[1].SuperOptions[1] != "memory" || got[1].MountPoint != "/sys/fs/cgroup/memory" {
		t.Errorf("cgroup entry %+v", got[1])
	}
	if got[2].MountPoint != "/var/lib/with space" || got[2].Source != "/dev/loop0" {
		t.Errorf("escaped entry %+v", got[2])
	}
}

func TestReadFindsRoot(t *testing.T) {
	got, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range got {
		if e.MountPoint == "/" {
			return
		}
	}
	t.Error("no mount at /")
}
