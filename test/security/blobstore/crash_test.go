package blobstore

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/test/security/internal/seckit"
)

// crashAtEveryStep (a subtest of TestPausedSandboxOutlivesItsNode, on its
// cluster: one start of the cluster less) kills a node (the fault points
// of the test build: internal/sandbox/faults_on.go) at each step of a
// pause into the blob store and of a resume, one sandbox going through
// them all, and checks after each that the sandbox is paused and
// resumable or running, on one node only, with its file and its
// processes' memory:
//
//   - A dies with the pack written, before the upload; A's restart stores
//     the sandbox again and dies mid-upload (some parts stored); the next
//     restart resumes that upload (the stored parts are not sent again)
//     and dies before the record names the blob; the next restart records
//     it: the pause completed across three crashes, and no part is left;
//   - resumed on A, A dies once the runtime has restored it from its
//     checkpoint, before the record says so; A's restart finds it
//     running, or paused again, and it runs after a connect;
//   - paused into the store again and A killed, B takes it over and dies
//     once the record names B (the sandbox unpacked, not started); B's
//     restart keeps it paused; B dies again after the record says running
//     but before the runtime starts it; B's restart pauses it again, and
//     it resumes on B; A, back, keeps nothing of it.
//
// Nothing is left: no unfinished upload, no blob once it runs, no mount,
// network namespace or loop device of the nodes (teardown, and below).
func crashAtEveryStep(t *testing.T, c *cluster) {
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	for _, n := range []struct {
		p    *proc
		step string
	}{{a, "pause-before-upload"}, {b, "resume-after-claim"}} {
		if n.p.p != nil {
			c.kill9(n.p)
		}
		c.restartArmed(t, n.p, n.step)
	}
	time.Sleep(time.Second) // the api sees them again
	mc := c.s3Client(t)

	sb := c.createOn(ctx, t, a.name)
	// A file; a counter that lives in memory only; 100 MiB more memory,
	// so that the pack is seven parts of the upload (16 MiB each, four
	// sent at a time): a crash once the first is stored leaves the last
	// three unsent.
	r, err := c.exec(ctx, sb, `echo kept-through-crashes > /home/user/note.txt
head -c 100M /dev/urandom > /dev/shm/ballast
`+startCounter)
	if err != nil || r.exit != 0 {
		t.Fatalf("setting up the sandbox: %v %+v", err, r)
	}
	before := atoi(strings.TrimSpace(r.stdout))
	intact := func(where string) {
		t.Helper()
		r, err := c.exec(ctx, sb, readCounter("/home/user/note.txt"))
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if err != nil || r.exit != 0 || len(lines) != 3 || lines[0] != "kept-through-crashes" || lines[1] != "alive" || atoi(lines[2]) <= before {
			t.Fatalf("%s: %v %q (the counter was %d before)", where, err, r.stdout, before)
		}
		before = atoi(lines[2])
	}
	rec, err := c.st.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	prefix := "warren/teams/" + rec.TeamID + "/sha256/"
	// paused checks the record says paused on node, with or without a
	// blob, and that no copy of it runs anywhere.
	paused := func(where, node string, blob bool) store.Sandbox {
		t.Helper()
		rec, err := c.st.GetSandbox(ctx, sb.ID)
		if err != nil || rec.State != store.StatePaused || rec.Node != node || (rec.PausedBlob != "") != blob {
			t.Fatalf("%s: want paused on %s (blob %v): %+v %v", where, node, blob, rec, err)
		}
		if n := runningCopies(sb.ID); len(n) != 0 {
			t.Fatalf("%s: paused, yet it runs: %v", where, n)
		}
		return rec
	}
	unfinished := func() []minio.ObjectMultipartInfo {
		var out []minio.ObjectMultipartInfo
		for u := range mc.ListIncompleteUploads(ctx, c.s3.Bucket, prefix, true) {
			if u.Err != nil {
				t.Fatal(u.Err)
			}
			out = append(out, u)
		}
		return out
	}
	objects := func() []string {
		var out []string
		for o := range mc.ListObjects(ctx, c.s3.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			out = append(out, o.Key)
		}
		return out
	}
	// What the test before left of its sandbox goes first (its blob is
	// removed in the background once it is killed).
	poll.Within(10*time.Second, 100*time.Millisecond, func() bool { return len(objects()) == 0 && len(unfinished()) == 0 })
	if u, o := unfinished(), objects(); len(u) != 0 || len(o) != 0 {
		t.Fatalf("before the crashes, the team has uploads %v and blobs %v in the store", u, o)
	}
	connect := func() (response, error) {
		return c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120})
	}
	started := time.Now()

	// 1. A dies with the pack written, nothing sent: not acknowledged.
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/pause", nil); err == nil && r.status == http.StatusNoContent {
		t.Fatalf("a pause whose node died before the upload was acknowledged: %v", r)
	}
	c.crashed(t, a)
	paused("A dead before the upload", a.name, false)
	if u, o := unfinished(), objects(); len(u) != 0 || len(o) != 0 {
		t.Fatalf("A sent something before the upload: uploads %v, objects %v", u, o)
	}

	// 2. A's restart stores it again, and dies mid-upload.
	c.crashingStart(t, a, "pause-mid-upload")
	paused("A dead mid-upload", a.name, false)
	u := unfinished()
	if len(u) != 1 || len(objects()) != 0 {
		t.Fatalf("after a crash mid-upload: uploads %+v (want one), objects %v", u, objects())
	}
	key := u[0].Key
	parts, err := minio.Core{Client: mc}.ListObjectParts(ctx, c.s3.Bucket, key, u[0].UploadID, 0, 1000)
	if err != nil || len(parts.ObjectParts) == 0 {
		t.Fatalf("the upload cut short stored no part: %+v %v", parts, err)
	}
	for _, p := range parts.ObjectParts {
		t.Logf("A died mid-upload; part %d of %s stored: %d bytes, ETag %s", p.PartNumber, key, p.Size, p.ETag)
	}

	// 3. The next restart resumes that upload, and dies before the
	// record names the blob.
	c.crashingStart(t, a, "pause-after-upload")
	paused("A dead after the upload", a.name, false)
	if line := logLine(a.logPath, "resumed an upload a crash cut short", sb.ID); line == "" {
		t.Errorf("A's restart sent the whole pack again: its log says no upload was resumed")
	} else {
		reused, total := atoi(logField(line, "reused_parts")), atoi(logField(line, "parts"))
		if reused < 1 || reused >= total {
			t.Errorf("the resumed upload reused %d of %d parts: not a crash mid-upload", reused, total)
		}
		t.Logf("the restart resumed the upload: %d of %d parts were stored already", reused, total)
	}
	if u, o := unfinished(), objects(); len(u) != 0 || len(o) != 1 || o[0] != key {
		t.Fatalf("after the resumed upload: uploads %v, objects %v (want only %s)", u, o, key)
	}

	// 4. The next restart records it: the pause is complete.
	c.restartArmed(t, a, "resume-after-restore")
	blob := "sha256:" + strings.TrimPrefix(key, prefix)
	poll.Within(30*time.Second, 100*time.Millisecond, func() bool {
		rec, err := c.st.GetSandbox(ctx, sb.ID)
		return err == nil && rec.PausedBlob == blob
	})
	paused("A's third restart", a.name, true)
	time.Sleep(time.Second) // the api sees A again

	// 5. A resume on A dies once the runtime has restored it: A's restart
	// finds it running (adopted), or paused again.
	if r, err := connect(); err == nil && r.status == http.StatusCreated {
		t.Fatalf("a resume whose node died was answered: %v", r)
	}
	c.crashed(t, a)
	c.restartArmed(t, a)
	rec, err = c.st.GetSandbox(ctx, sb.ID)
	if err != nil || rec.Node != a.name || (rec.State != store.StateRunning && rec.State != store.StatePaused) {
		t.Fatalf("after A died mid-resume: %+v %v", rec, err)
	}
	t.Logf("A died after the restore; after its restart the sandbox is %s", rec.State)
	if n := runningCopies(sb.ID); (rec.State == store.StateRunning && (len(n) != 1 || n[a.name] != 1)) || (rec.State == store.StatePaused && len(n) != 0) {
		t.Fatalf("after A died mid-resume the record says %s, and copies run on %v", rec.State, n)
	}
	if rec.State == store.StateRunning && rec.PausedBlob != "" {
		t.Errorf("adopted running after a resume cut short, its record still names its blob %s", rec.PausedBlob)
	}
	time.Sleep(time.Second) // the api sees A again
	if r, err := connect(); err != nil || (r.status != http.StatusCreated && r.status != http.StatusOK) {
		t.Fatalf("connect after A died mid-resume: %v %v", r, err)
	}
	intact("after A died mid-resume")
	poll.Within(10*time.Second, 100*time.Millisecond, func() bool { return len(objects()) == 0 })
	if o := objects(); len(o) != 0 {
		t.Errorf("the blob of a sandbox running again stays: %v", o)
	}

	// 6. Paused into the store, A killed: B takes it over and dies once
	// the record names B, before the sandbox runs.
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/pause", nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("pause: %v %v", r, err)
	}
	paused("paused on A", a.name, true)
	c.kill9(a)
	time.Sleep(lostAfter + time.Second)
	if r, err := connect(); err == nil && r.status < 500 {
		t.Fatalf("connect through a node that died after its takeover's claim: %v", r)
	}
	c.crashed(t, b)
	rec = paused("B dead after its claim", b.name, true)
	if !strings.HasPrefix(rec.RootfsDir, b.dataDir+"/") {
		t.Fatalf("B's claim records the files at %q, not in B's data dir", rec.RootfsDir)
	}

	// 7. B, back, keeps it paused; it dies again once the record says
	// running, before the runtime starts it; back, it pauses it again.
	c.restartArmed(t, b, "resume-before-restore")
	paused("B back after its claim", b.name, true)
	time.Sleep(time.Second) // the api sees B again
	if r, err := connect(); err == nil && r.status < 500 {
		t.Fatalf("connect through a node that died before the restore: %v", r)
	}
	c.crashed(t, b)
	c.restartArmed(t, b)
	paused("B back after it died before the restore", b.name, true)
	time.Sleep(time.Second)
	if r, err := connect(); err != nil || r.status != http.StatusCreated {
		t.Fatalf("connect on B: %v %v", r, err)
	}
	intact("resumed on B after two crashes of B")
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.State != store.StateRunning || rec.Node != b.name || rec.PausedBlob != "" {
		t.Fatalf("resumed on B: %+v %v", rec, err)
	}
	if n := runningCopies(sb.ID); len(n) != 1 || n[b.name] != 1 {
		t.Fatalf("resumed on B, copies run on %v", n)
	}
	poll.Within(10*time.Second, 100*time.Millisecond, func() bool { return len(objects()) == 0 })
	if u, o := unfinished(), objects(); len(u) != 0 || len(o) != 0 {
		t.Errorf("once it runs, the store keeps uploads %v and blobs %v of its team", u, o)
	}

	// 8. A, back, keeps nothing of it.
	c.restartArmed(t, a)
	if _, err := os.Stat(filepath.Join(a.dataDir, "sandboxes", sb.ID)); err == nil {
		t.Errorf("A kept the files of the sandbox B resumed")
	}
	if devs := loopDevicesBelow([]string{a.dataDir}); len(devs) != 0 {
		t.Errorf("A, without sandboxes, holds loop devices: %v", devs)
	}
	t.Logf("seven crashes and their restarts took %s", time.Since(started).Round(time.Millisecond))
}

// armed is the environment of a node that exits at the fault points.
func armed(steps ...string) []string {
	if len(steps) == 0 {
		return nil
	}
	for i, s := range steps {
		steps[i] = s + ":*"
	}
	return []string{"WARREN_TEST_FAULT=" + strings.Join(steps, ",")}
}

// restartArmed starts node p again, exiting at steps.
func (c *cluster) restartArmed(t *testing.T, p *proc, steps ...string) {
	t.Helper()
	p.extraEnv = armed(steps...)
	if err := c.start(p, "http://"+p.addr+"/health"); err != nil {
		t.Fatal(err)
	}
}

// crashingStart starts node p again, to exit at step during its start
// (what it resumes of a cut-short pause), and waits for it to.
func (c *cluster) crashingStart(t *testing.T, p *proc, step string) {
	t.Helper()
	p.extraEnv = armed(step)
	f, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bin := c.warren
	if p.bin != "" {
		bin = p.bin
	}
	cmd := exec.Command(bin, p.args...)
	cmd.Env = append(append([]string{}, c.env...), p.extraEnv...)
	if p.p, err = seckit.StartProc(cmd, f, p.name); err != nil {
		t.Fatal(err)
	}
	c.crashed(t, p)
}

// logLine is the last line of the log holding msg and sandbox id.
func logLine(path, msg, id string) string {
	b, _ := os.ReadFile(path)
	line := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, msg) && strings.Contains(l, "sandbox="+id) {
			line = l
		}
	}
	return line
}

// logField is the value of name=value in a text log line.
func logField(line, name string) string {
	_, v, _ := strings.Cut(line, " "+name+"=")
	v, _, _ = strings.Cut(v, " ")
	return v
}

// runningCopies counts, by node, the gVisor sandbox processes of sandbox
// id (their command lines name its runtime dir, below the node's run dir).
func runningCopies(id string) map[string]int {
	out := map[string]int{}
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err != nil || !strings.HasPrefix(string(b), "runsc-sandbox\x00") {
			continue
		}
		args := strings.ReplaceAll(string(b), "\x00", " ")
		if !strings.Contains(args, "/sandboxes/"+id+"/") {
			continue
		}
		for _, n := range nodeSpecs {
			if strings.Contains(args, "/run/warren-"+n.name+"/") {
				out[n.name]++
			}
		}
	}
	return out
}

// loopDevicesBelow lists the loop devices backed by files below dirs.
func loopDevicesBelow(dirs []string) []string {
	out, _ := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	var devs []string
	for _, l := range strings.Split(string(out), "\n") {
		for _, d := range dirs {
			if d != "" && strings.Contains(l, d+"/") {
				devs = append(devs, strings.TrimSpace(l))
			}
		}
	}
	return devs
}
