package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/poll"
)

// holdMounts starts a process in a mount namespace of its own, a copy of
// this one's taken while dir's file systems were mounted, as a runtime
// process of any server on the host (runsc's sandbox and gofer unshare
// their mount namespace before they pivot into their own root) holds
// for a moment. Its copies are made private (as runsc's are), so that
// unmounts here never reach them even if another test made the host's
// mounts shared meanwhile; dir's file systems live on in it until the
// process goes. It returns a function that ends the process.
func holdMounts(t *testing.T, dir string) (release func()) {
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
	// host's (systemd mounts / shared), and an unmount here would reach
	// them. So the holder counts once it runs sleep.
	proc := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid))
	held := func() bool {
		if comm, _ := os.ReadFile(filepath.Join(proc, "comm")); string(comm) != "sleep\n" {
			return false
		}
		b, _ := os.ReadFile(filepath.Join(proc, "mountinfo"))
		return strings.Contains(string(b), dir+"/disk ")
	}
	if !poll.Within(5*time.Second, 5*time.Millisecond, held) {
		t.Fatalf("the holder's mount namespace never showed %s/disk", dir)
	}
	return release
}

// A paused sandbox's disk may still be mounted in another process's mount
// namespace when it is resumed (another server's runsc starting up copied
// the host's mounts a moment before the pause unmounted them). Its
// file system then lives on there, with what the sandbox wrote maybe
// still only in memory: mounting the image a second time through a new
// loop device would show a stale disk (the overlay's upper dir missing:
// "mounting the overlay: no such file or directory", issue 28) and two
// ext4 instances writing one image. Remount waits for the old one to go,
// and fails cleanly, files kept, if it does not go in time.
func TestRemountWaitsForADiskHeldElsewhere(t *testing.T) {
	s, layer := tinyStore(t)
	ctx := context.Background()
	r, err := s.Mount(ctx, "held", []string{layer}, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove("held")
	if err := os.WriteFile(filepath.Join(r.Dir(), "written"), []byte("before the pause"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The holder goes soon after the pause (runsc pivots into its own
	// root within milliseconds): the resume waits for it, and finds
	// everything.
	release := holdMounts(t, r.Home())
	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(300 * time.Millisecond); release() }()
	r2, err := s.Remount(ctx, "held", []string{layer})
	if err != nil {
		t.Fatalf("Remount while another namespace held the disk for 300ms: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(r2.Dir(), "written")); err != nil || string(b) != "before the pause" {
		t.Errorf("after Remount: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(r2.Dir(), "written"), []byte("after the resume"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The holder stays: the resume fails without mounting anything, and
	// works once it is gone.
	release = holdMounts(t, r2.Home())
	if err := r2.Detach(); err != nil {
		t.Fatal(err)
	}
	s.Manager.diskReleaseWait = 500 * time.Millisecond
	if _, err := s.Remount(ctx, "held", []string{layer}); err == nil || !strings.Contains(err.Error(), "still mounted") {
		t.Errorf("Remount while the disk stays held elsewhere: %v, want a \"still mounted\" error", err)
	}
	if m := mountsUnder(t, r2.Home()); len(m) > 0 {
		t.Errorf("mounts left by the failed Remount: %v", m)
	}
	release()
	r3, err := s.Remount(ctx, "held", []string{layer})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(r3.Dir(), "written")); err != nil || string(b) != "after the resume" {
		t.Errorf("after the second Remount: %q %v", b, err)
	}
}
