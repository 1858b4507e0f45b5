package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/network/testhost"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/runtime"
)

// counterScript starts, in the background, a server on :8000 whose answer
// is a counter that lives only in its memory, and prints its pid.
const counterScript = `nohup python3 -c '
import http.server, itertools, os
c = itertools.count(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(("%d %d" % (next(c), os.getpid())).encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()' >/dev/null 2>&1 &
for i in $(seq 50); do curl -s localhost:8000/ >/dev/null && break; sleep 0.1; done`

// counter asks the sandbox's counter server for its next value and pid.
func counter(t *testing.T, inst *Instance) (n, pid int) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second, Transport: freshConns.Transport}
	res, err := c.Get("http://" + net.JoinHostPort(inst.Slot.SandboxIP.String(), "8000") + "/")
	if err != nil {
		t.Fatalf("counter of %s: %v", inst.ID, err)
	}
	defer res.Body.Close()
	b := make([]byte, 64)
	k, _ := res.Body.Read(b)
	if _, err := fmt.Sscanf(string(b[:k]), "%d %d", &n, &pid); err != nil {
		t.Fatalf("counter of %s answered %q", inst.ID, b[:k])
	}
	return n, pid
}

// cgroupMemory is what the sandbox's memory cgroup is charged (-1 when
// it has none).
func cgroupMemory(id string) int64 {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/warren-node-test", id, "memory.usage_in_bytes"))
	if err != nil {
		return -1
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// failing is a runtime whose checkpoints or restores fail on demand.
type failing struct {
	runtime.Runtime
	checkpoint, restore bool
}

func (f *failing) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	if f.checkpoint {
		return errors.New("checkpoint failed on purpose")
	}
	return f.Runtime.Checkpoint(ctx, id, dir, leaveRunning)
}

func (f *failing) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	if f.restore {
		return errors.New("restore failed on purpose")
	}
	return f.Runtime.Restore(ctx, spec, dir)
}

func TestPauseToDiskAndResume(t *testing.T) {
	n := testNode(t, "runsc")
	fr := &failing{Runtime: n.cfg.Runtime}
	n.cfg.Runtime = fr
	req := baseRequest(t, "lc-pause")
	inst := create(t, n, req)
	tok := "tok-" + inst.ID
	if out, code := sh(t, inst, tok, "", counterScript+"\necho kept > /home/user/file\nhead -c 64M /dev/urandom > /home/user/ballast", 60*time.Second); code != 0 {
		t.Fatalf("setup: %d %q", code, out)
	}
	first, pid := counter(t, inst)
	ctx := context.Background()

	// A checkpoint that fails leaves the sandbox running, not frozen.
	fr.checkpoint = true
	if _, err := n.PauseToDisk(ctx, inst, true); err == nil || !strings.Contains(err.Error(), "runs on") {
		t.Fatalf("failed checkpoint: %v", err)
	}
	fr.checkpoint = false
	if st, _ := n.State(ctx, inst.ID); st != runtime.StateRunning {
		t.Errorf("after a failed checkpoint the sandbox is %s", st)
	}
	if got, _ := counter(t, inst); got != first+1 {
		t.Errorf("counter after a failed checkpoint = %d, want %d", got, first+1)
	}
	if _, err := os.Stat(inst.Rootfs.CheckpointDir() + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("a failed checkpoint left its image: %v", err)
	}

	charged := cgroupMemory(inst.ID)
	oldIP, slotName := inst.Slot.SandboxIP, inst.Slot.Name
	p, err := n.PauseToDisk(ctx, inst, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.DeletePaused(context.Background(), p) })
	// Nothing of it runs or is mounted; its slot is gone; its memory
	// cgroup (which was charged) is gone.
	if _, err := n.State(ctx, p.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("container after the pause: %v", err)
	}
	if charged <= 0 || cgroupMemory(p.ID) != -1 {
		t.Errorf("memory cgroup charged %d before the pause, still there after: %v", charged, cgroupMemory(p.ID) != -1)
	}
	if _, err := os.Stat("/run/netns/" + slotName); !os.IsNotExist(err) {
		t.Errorf("its slot %s is still there: %v", slotName, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), p.Dir+"/") {
		t.Errorf("mounts left below %s", p.Dir)
	}
	if _, err := os.Stat(filepath.Join(p.Checkpoint, "checkpoint.img")); err != nil {
		t.Errorf("checkpoint image: %v", err)
	}

	// A failed restore keeps it paused, files and checkpoint intact.
	fr.restore = true
	var recorded string
	if _, err := n.ResumeFromDisk(ctx, req, p, true, func(i *Instance) error { recorded = i.Slot.Name; return nil }); err == nil {
		t.Fatal("a failing restore resumed")
	} else if re := (*ResumeError)(nil); !errors.As(err, &re) || re.Step != "restoring its memory checkpoint" {
		t.Errorf("failed restore: %v", err)
	}
	fr.restore = false
	if recorded == "" {
		t.Error("commit did not see the slot")
	}
	if _, err := os.Stat(filepath.Join(p.Checkpoint, "checkpoint.img")); err != nil {
		t.Errorf("checkpoint after a failed restore: %v", err)
	}

	resumed, err := n.ResumeFromDisk(ctx, req, p, true, func(*Instance) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if resumed.Slot.SandboxIP == oldIP {
		t.Logf("resumed at the same address %s (the slot was free again)", oldIP)
	}
	// Its processes continue: the same pid, the counter goes on.
	if got, gotPid := counter(t, resumed); got != first+2 || gotPid != pid {
		t.Errorf("after resume: counter %d pid %d, want %d and %d", got, gotPid, first+2, pid)
	}
	if out, _ := sh(t, resumed, tok, "", "cat /home/user/file; stat -c %s /home/user/ballast; ip -4 -o addr show eth0 | awk '{print $4}'", 10*time.Second); out != fmt.Sprintf("kept\n%d\n%s/30\n", 64<<20, resumed.Slot.SandboxIP) {
		t.Errorf("after resume: %q", out)
	}
	if err := n.DropCheckpoint(p); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(p.Checkpoint); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dropped checkpoint is still at its place: %v", err)
	}
	if !poll.Within(30*time.Second, 20*time.Millisecond, func() bool {
		left, _ := filepath.Glob(p.Checkpoint + "*")
		return len(left) == 0
	}) {
		t.Error("the dropped checkpoint's files were not removed within 30 s")
	}

	// Without its memory, its files are kept and it boots anew.
	p2, err := n.PauseToDisk(ctx, resumed, false)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Checkpoint != "" {
		t.Errorf("a pause without memory has a checkpoint: %q", p2.Checkpoint)
	}
	again, err := n.ResumeFromDisk(ctx, req, p2, true, func(*Instance) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Delete(context.Background(), again) })
	if out, _ := sh(t, again, tok, "", "cat /home/user/file; pgrep -x python3 || echo none", 10*time.Second); out != "kept\nnone\n" {
		t.Errorf("after a resume without memory: %q", out)
	}
}

// A snapshot of a running sandbox starts any number of sandboxes with its
// processes, memory and files; each has its own address, hostname and
// /etc/hosts, and they and the source go on independently.
func TestSnapshotRestoresLiveState(t *testing.T) {
	n := testNode(t, "runsc")
	src := create(t, n, baseRequest(t, "lc-src"))
	tok := "tok-" + src.ID
	if out, code := sh(t, src, tok, "", counterScript+"\necho from-source > /home/user/file", 60*time.Second); code != 0 {
		t.Fatalf("setup: %d %q", code, out)
	}
	base, pid := counter(t, src)
	dir := filepath.Join(t.TempDir(), "snap")
	ctx := context.Background()
	if err := n.Snapshot(ctx, src, dir); err != nil {
		t.Fatal(err)
	}
	if st, _ := n.State(ctx, src.ID); st != runtime.StateRunning {
		t.Errorf("source after the snapshot: %s", st)
	}
	var children []*Instance
	for i := range 2 {
		req := baseRequest(t, fmt.Sprintf("lc-child%d", i))
		req.DiskImage = filepath.Join(dir, SnapshotDiskName)
		c, err := n.Restore(ctx, req, dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Delete(context.Background(), c) })
		children = append(children, c)
	}
	for i, c := range children {
		if got, gotPid := counter(t, c); got != base+1 || gotPid != pid {
			t.Errorf("child %d: counter %d pid %d, want %d and %d", i, got, gotPid, base+1, pid)
		}
		out, _ := sh(t, c, tok, "", "cat /home/user/file; hostname; grep -w $(hostname) /etc/hosts | awk '{print $2}'; timeout 5 sudo -n true 2>&1 && echo sudo-ok", 10*time.Second)
		if want := fmt.Sprintf("from-source\n%s\n%s\nsudo-ok\n", c.ID, c.ID); out != want {
			t.Errorf("child %d: %q, want %q", i, out, want)
		}
	}
	// They diverge.
	sh(t, children[0], tok, "", "echo child0 > /home/user/file", 10*time.Second)
	if out, _ := sh(t, children[1], tok, "", "cat /home/user/file", 10*time.Second); out != "from-source\n" {
		t.Errorf("child 1 sees %q", out)
	}
	if out, _ := sh(t, src, tok, "", "cat /home/user/file", 10*time.Second); out != "from-source\n" {
		t.Errorf("the source sees %q", out)
	}
	if got, _ := counter(t, src); got != base+1 {
		t.Errorf("source counter %d, want %d", got, base+1)
	}
}

// What gVisor does with the network on restore (docs/design/lifecycle.md):
// the restored stack takes the new slot's address and routes from its
// namespace, so a sandbox resumed or forked into another slot answers at
// its new address on 0.0.0.0 listeners and reaches out through its new
// veth; only sockets bound to the old address itself are left behind.
func TestRestoreTakesTheNewSlotsAddress(t *testing.T) {
	n := testNode(t, "runsc")
	public := testhost.New(t, "wntxw", netip.MustParsePrefix("198.18.0.6/30"))
	port := public.ServeTCP(t, 0, testhost.HTTPReply("public"))
	src := create(t, n, baseRequest(t, "lc-net"))
	tok := "tok-" + src.ID
	old := src.Slot.SandboxIP
	if out, code := sh(t, src, tok, "", counterScript+fmt.Sprintf(`
nohup python3 -m http.server --bind %s 8001 >/dev/null 2>&1 &
for i in $(seq 50); do curl -s -o /dev/null %s:8001/ && break; sleep 0.1; done`, old, old), 60*time.Second); code != 0 {
		t.Fatalf("setup: %d %q", code, out)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	ctx := context.Background()
	if err := n.Snapshot(ctx, src, dir); err != nil {
		t.Fatal(err)
	}
	req := baseRequest(t, "lc-net2")
	req.DiskImage = filepath.Join(dir, SnapshotDiskName)
	c, err := n.Restore(ctx, req, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Delete(context.Background(), c) })
	if c.Slot.SandboxIP == old {
		t.Fatal("the restored sandbox got the old address")
	}
	out, _ := sh(t, c, tok, "", fmt.Sprintf(`ip -4 -o addr show eth0 | awk '{print $4}'
ip route show default | awk '{print $3}'
curl -s -m 5 http://%s:%d/
echo
curl -s -m 3 -o /dev/null -w '%%{http_code}' http://%s:8001/ || true`, public.Addr, port, old), 30*time.Second)
	want := fmt.Sprintf("%s/30\n%s\npublic\n000", c.Slot.SandboxIP, c.Slot.HostIP)
	if out != want {
		t.Errorf("inside the restored sandbox:\n%q\nwant\n%q", out, want)
	}
	// Reached at its new address from the host, its listener's memory
	// intact.
	if got, _ := counter(t, c); got < 2 {
		t.Errorf("counter at the new address: %d", got)
	}
}
