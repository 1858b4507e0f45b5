package security

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A tenant using up its own resources (disk, tasks, memory, open files)
// must meet its own limits: the node, its API and the witness sandbox go
// on unaffected, and the host's disk keeps its free space.

func TestBuildStepFillsItsDisk(t *testing.T) {
	afterCase(t)
	before := S.srv.freeMB()
	// Far past any build disk limit, and past the data dir's file system
	// if there is no limit: 3 GiB, which the suite's file system has.
	b := linkTemplate(t, S.teamA, "sec-build-disk",
		`fallocate -l 3G /big 2>&1; echo "fallocate-exit=$?"; rm -f /big; `+
			`dd if=/dev/zero of=/big2 bs=1M count=700 2>&1; sync; true`)
	t.Logf("build: %s %v\n%s", b.Status, b.Err, b.stepLogs("1"))
	if b.Err == nil {
		defer removeLayers(t, ownLayers(t, b.BuildID))
	}
	after := S.srv.freeMB()
	logs := b.stepLogs("1")
	if strings.Contains(logs, "fallocate-exit=0") {
		t.Errorf("a build step allocated 3 GiB: build sandboxes have no disk limit")
	}
	if b.Err == nil && !strings.Contains(logs, "No space left") {
		t.Errorf("the build step's writes did not meet a disk limit (no ENOSPC):\n%s", logs)
	}
	// What the step keeps is bounded by its disk (--build-disk-mb).
	if used := before - after; used > buildDiskMB+256 {
		t.Errorf("one build step took %d MiB of the data dir's file system (free %d → %d MiB)", used, before, after)
	}
}

func TestSandboxFillsItsDisk(t *testing.T) {
	afterCase(t)
	before := S.srv.freeMB()
	sb := mustCreate(t, S.teamA, createOpts{})
	r := sb.run(t, "user", `fallocate -l 3G /home/user/big; echo "fallocate-exit=$?"; `+
		`dd if=/dev/zero of=/home/user/fill bs=1M count=1300 2>&1 | tail -1; df -m /home/user | tail -1`)
	during := S.srv.freeMB()
	if strings.Contains(r.Stdout, "fallocate-exit=0") {
		t.Errorf("a sandbox allocated 3 GiB past its 1 GiB disk: %s", r)
	}
	if !strings.Contains(r.Stdout+r.Stderr, "No space left") {
		t.Errorf("the sandbox's writes did not meet its disk limit (no ENOSPC): %s", r)
	}
	if used := before - during; used > 1024+256 {
		t.Errorf("one sandbox took %d MiB of the data dir's file system (free %d → %d MiB)", used, before, during)
	}
}

// hog starts a hostile command in the background in a sandbox of its
// own, lets it work for a while, checks that the node and the witness
// answer meanwhile, and kills the sandbox.
func hog(t *testing.T, script string, work time.Duration) {
	t.Helper()
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	sb.ok(t, "root", "cat > /root/hog.sh <<'HOG'\n"+script+"\nHOG\nnohup sh /root/hog.sh >/root/hog.log 2>&1 &")
	time.Sleep(work)
	nodeHealthy(t)
	if r, err := sb.exec(context.Background(), "root", "cat /root/hog.log", 3*time.Second); err == nil {
		t.Logf("the hostile command so far: %s", r)
	} else {
		t.Logf("the hog's sandbox no longer answers (allowed): %v", err)
	}
}

func TestForkBomb(t *testing.T) {
	hog(t, `f() { f | f & }; f`, 4*time.Second)
}

func TestMemoryHog(t *testing.T) {
	// 4 GiB touched in a 512 MiB sandbox.
	hog(t, `python3 -c 'b = bytearray(4 << 30); print("allocated", len(b))'`, 4*time.Second)
}

func TestHundredThousandOpenFiles(t *testing.T) {
	hog(t, `ulimit -n 200000 2>/dev/null || ulimit -n 65536; exec python3 - <<'EOF'
import os, time
fds = []
try:
    for i in range(100000):
        fds.append(os.open("/etc/hostname" if i % 2 else "/dev/null", os.O_RDONLY))
except OSError as e:
    print("stopped at", len(fds), e, flush=True)
print("open", len(fds), flush=True)
time.sleep(60)
EOF`, 5*time.Second)
}
