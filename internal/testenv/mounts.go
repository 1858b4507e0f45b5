package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
)

// HoldMounts starts a process in a mount namespace of its own, a copy of
// the test's (as a runtime starting up makes one), and returns once that
// copy holds what is mounted at mountPoint; release ends the process (at
// the latest when the test ends). An unmount in the test's namespace then
// leaves the file system alive in the holder's: the tests of what
// mounts a loop-backed image again (internal/rootfs, internal/volume).
func HoldMounts(t *testing.T, mountPoint string) (release func()) {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	release = func() {
		cmd.Process.Kill()
		<-done
	}
	t.Cleanup(release)
	// unshare copies the mounts, then makes its copies private, then
	// execs sleep: until the exec the copies may still be peers of the
	// test's (systemd mounts / shared), and an unmount there would reach
	// them. So the holder counts once it runs sleep.
	proc := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid))
	held := func() bool {
		if comm, _ := os.ReadFile(filepath.Join(proc, "comm")); string(comm) != "sleep\n" {
			return false
		}
		b, _ := os.ReadFile(filepath.Join(proc, "mountinfo"))
		return strings.Contains(string(b), " "+mountPoint+" ")
	}
	if !poll.Within(5*time.Second, 5*time.Millisecond, held) {
		t.Fatalf("the holder's mount namespace never showed %s", mountPoint)
	}
	return release
}
