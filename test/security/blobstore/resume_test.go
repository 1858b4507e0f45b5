package blobstore

import (
	"bytes"
	"context"
	"errors"
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
)

// TestPausedSandboxOutlivesItsNode: node A crashes mid-pause (after the
// upload, before the record names the blob) and the sandbox is paused
// and resumable on A; paused again, A is killed with SIGKILL; node B
// crashes mid-resume (after the download) and the sandbox is still
// paused; a corrupted and a truncated blob are refused and the sandbox
// stays paused; the whole blob resumes on B with the sandbox's files
// and processes; drained, B pauses it into the store again and it
// resumes on A; another team reaches nothing; the S3 credentials appear
// in no log or answer; evicted from A's bounded copies, it comes back
// from the store; paused there again and A killed, it is killed
// through the api (record and blob removed) and A, back, keeps nothing.
func TestPausedSandboxOutlivesItsNode(t *testing.T) {
	fault := func(step string) []string {
		return []string{"WARREN_TEST_FAULT=" + step + ":*"}
	}
	c := startCluster(t, map[string][]string{"wbsa": fault("pause-after-upload"), "wbsb": fault("resume-after-download")}, false)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]

	// Another team, to knock on the sandbox's door.
	const other = "blob-other-team"
	c.newTeam(ctx, t, other)

	sb := c.createOn(ctx, t, a.name)
	// A file, and a process whose state lives in its memory only: a
	// counter it writes out on SIGUSR1, started before the pauses.
	r, err := c.exec(ctx, sb, "echo kept-across-nodes > /home/user/note.txt\n"+startCounter)
	if err != nil || r.exit != 0 {
		t.Fatalf("setting up the sandbox: %v %+v", err, r)
	}
	before := atoi(strings.TrimSpace(r.stdout))
	// counted checks the sandbox's file and that its counter went on
	// from where it was (its memory was restored, not booted anew).
	counted := func(where string) {
		t.Helper()
		r, err := c.exec(ctx, sb, readCounter("/home/user/note.txt"))
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if err != nil || r.exit != 0 || len(lines) != 3 || lines[0] != "kept-across-nodes" || lines[1] != "alive" || atoi(lines[2]) <= before {
			t.Fatalf("%s: %v %q (the counter was %d before)", where, err, r.stdout, before)
		}
		before = atoi(lines[2])
	}

	// A dies after the upload, before the record names the blob: the
	// pause is not acknowledged, and after A's restart the sandbox is
	// paused there (its files on A) and resumes with its processes.
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/pause", nil); err == nil && r.status == http.StatusNoContent {
		t.Fatalf("a pause whose node crashed before it was recorded was acknowledged: %v", r)
	}
	c.crashed(t, a)
	if err := c.start(a, "http://"+a.addr+"/health"); err != nil {
		t.Fatal(err)
	}
	// (A's restart stores it again: its record may name the blob by now.)
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.State != store.StatePaused || rec.Node != a.name {
		t.Fatalf("after a crash mid-pause: %+v %v", rec, err)
	}
	time.Sleep(time.Second) // the api sees A again
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}); err != nil || r.status != http.StatusCreated {
		t.Fatalf("connect after a crash mid-pause: %v %v", r, err)
	}
	counted("resumed on A after its crash mid-pause")

	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/pause", nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("pause: %v %v", r, err)
	}
	rec, err := c.st.GetSandbox(ctx, sb.ID)
	if err != nil || rec.State != store.StatePaused || rec.Node != a.name || !strings.HasPrefix(rec.PausedBlob, "sha256:") {
		t.Fatalf("after the pause: %+v %v", rec, err)
	}
	key := "warren/teams/" + rec.TeamID + "/sha256/" + strings.TrimPrefix(rec.PausedBlob, "sha256:")
	mc := c.s3Client(t)
	good := filepath.Join(t.TempDir(), "blob")
	if err := mc.FGetObject(ctx, c.s3.Bucket, key, good, minio.GetObjectOptions{}); err != nil {
		t.Fatalf("the paused sandbox's blob is not in the store at %s: %v", key, err)
	}
	goodBytes, _ := os.ReadFile(good)
	t.Logf("paused: blob %s, %d bytes", rec.PausedBlob, len(goodBytes))

	c.kill9(a)
	time.Sleep(lostAfter + time.Second)

	// B dies after the download, before it takes the sandbox over: the
	// sandbox is still A's, paused, its blob in the store.
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}); err == nil && r.status < 500 {
		t.Fatalf("connect through a node that crashed mid-resume: %v", r)
	} else {
		t.Logf("connect through a node that crashes mid-resume: %v %v", r, err)
	}
	c.crashed(t, b)
	if err := c.start(b, "http://"+b.addr+"/health"); err != nil {
		t.Fatal(err)
	}
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.State != store.StatePaused || rec.Node != a.name || rec.PausedBlob == "" {
		t.Fatalf("after a crash mid-resume: %+v %v", rec, err)
	}
	time.Sleep(time.Second) // the api sees B again

	// The other team finds nothing, paused blob or not.
	for _, call := range [][2]string{{"GET", "/sandboxes/" + sb.ID}, {"POST", "/sandboxes/" + sb.ID + "/connect"}, {"POST", "/sandboxes/" + sb.ID + "/resume"}} {
		body := map[string]any{"timeout": 60}
		if call[0] == "GET" {
			body = nil
		}
		if r, err := c.call(ctx, c.otherKey, call[0], call[1], body); err != nil || r.status != http.StatusNotFound {
			t.Errorf("another team's %s %s: %v %v", call[0], call[1], r, err)
		}
	}

	// A corrupted blob is refused: the sandbox stays paused, still A's.
	bad := bytes.Clone(goodBytes)
	bad[len(bad)/2] ^= 0xff
	if _, err := mc.PutObject(ctx, c.s3.Bucket, key, bytes.NewReader(bad), int64(len(bad)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	r2, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120})
	if err != nil || r2.status < 500 || !strings.Contains(string(r2.body), "blob") {
		t.Fatalf("connect with a corrupted blob: %v %v", r2, err)
	}
	t.Logf("corrupted blob refused: %s", r2)
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.State != store.StatePaused || rec.Node != a.name {
		t.Fatalf("after the refused resume: %+v %v", rec, err)
	}
	// A truncated one too.
	if _, err := mc.PutObject(ctx, c.s3.Bucket, key, bytes.NewReader(goodBytes[:len(goodBytes)/3]), int64(len(goodBytes)/3), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if r3, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}); err != nil || r3.status < 500 {
		t.Fatalf("connect with a truncated blob: %v %v", r3, err)
	}

	// The whole blob back: it resumes on B, files and processes intact.
	if _, err := mc.PutObject(ctx, c.s3.Bucket, key, bytes.NewReader(goodBytes), int64(len(goodBytes)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r4, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120})
	if err != nil || (r4.status != http.StatusCreated && r4.status != http.StatusOK) {
		t.Fatalf("connect after A's loss: %v %v", r4, err)
	}
	t.Logf("resumed on the other node in %s", time.Since(start).Round(time.Millisecond))
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.State != store.StateRunning || rec.Node != b.name || rec.PausedBlob != "" {
		t.Fatalf("after the resume: %+v %v", rec, err)
	}
	counted("resumed on B after A was killed")
	// The resumed sandbox's blob is garbage now, and goes.
	poll.Within(10*time.Second, 100*time.Millisecond, func() bool {
		_, err := mc.StatObject(ctx, c.s3.Bucket, key, minio.StatObjectOptions{})
		return err != nil
	})
	if _, err := mc.StatObject(ctx, c.s3.Bucket, key, minio.StatObjectOptions{}); err == nil {
		t.Errorf("the blob of a resumed sandbox is still in the store")
	}

	// A comes back: the sandbox is B's, A keeps nothing of it.
	if err := c.start(a, "http://"+a.addr+"/health"); err != nil {
		t.Fatal(err)
	}
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.Node != b.name || rec.State != store.StateRunning {
		t.Fatalf("after A's restart: %+v %v", rec, err)
	}
	if _, err := os.Stat(filepath.Join(a.dataDir, "sandboxes", sb.ID)); err == nil {
		t.Errorf("A kept the files of the sandbox B resumed")
	}

	// `warren nodes drain` of B pauses the sandbox into the store, and
	// it resumes on A (ready) on its next connect, as it was.
	if out, err := exec.CommandContext(ctx, c.warren, "nodes", "drain", b.name, "--timeout", "2m", "--store", c.storeURL).CombinedOutput(); err != nil {
		t.Fatalf("warren nodes drain: %v: %s", err, out)
	}
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.State != store.StatePaused || rec.Node != b.name || rec.PausedBlob == "" {
		t.Fatalf("after B's drain: %+v %v", rec, err)
	}
	time.Sleep(time.Second) // the api sees B draining
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}); err != nil || r.status != http.StatusCreated {
		t.Fatalf("connect after B's drain: %v %v", r, err)
	}
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.State != store.StateRunning || rec.Node != a.name {
		t.Fatalf("after the connect that followed B's drain: %+v %v", rec, err)
	}
	counted("resumed on A after B's drain")
	if err := c.setNode(ctx, b.name, store.NodeReady); err != nil {
		t.Fatal(err)
	}

	// Paused on A, whose copies are bounded to 1 MiB: its copy is
	// evicted, and the resume fetches it back from the store.
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/pause", nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("pause on A: %v %v", r, err)
	}
	home := filepath.Join(a.dataDir, "sandboxes", sb.ID)
	poll.Within(10*time.Second, 50*time.Millisecond, func() bool { _, err := os.Stat(home); return err != nil })
	if _, err := os.Stat(home); err == nil {
		t.Fatalf("A kept its copy of the paused sandbox beyond --blob-cache-mb")
	}
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 120}); err != nil || r.status != http.StatusCreated {
		t.Fatalf("connect after the eviction: %v %v", r, err)
	}
	counted("resumed on A from the store after its copy was evicted")

	// Paused into the store on A, A killed: the api kills it through B
	// (record and blob go), and A, back, keeps nothing of it.
	killSteps := time.Now()
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+sb.ID+"/pause", nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("pause on A before its loss: %v %v", r, err)
	}
	rec, err = c.st.GetSandbox(ctx, sb.ID)
	if err != nil || rec.State != store.StatePaused || rec.Node != a.name || rec.PausedBlob == "" {
		t.Fatalf("paused on A: %+v %v", rec, err)
	}
	key = "warren/teams/" + rec.TeamID + "/sha256/" + strings.TrimPrefix(rec.PausedBlob, "sha256:")
	c.kill9(a)
	time.Sleep(lostAfter + time.Second)
	if r, err := c.call(ctx, c.otherKey, "DELETE", "/sandboxes/"+sb.ID, nil); err != nil || r.status != http.StatusNotFound {
		t.Errorf("another team's kill of a lost node's paused sandbox: %v %v", r, err)
	}
	if r, err := c.call(ctx, c.apiKey, "DELETE", "/sandboxes/"+sb.ID, nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("kill of a sandbox paused in the store by a lost node: %v %v", r, err)
	}
	if rec, err := c.st.GetSandbox(ctx, sb.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the killed sandbox's record stays: %+v %v", rec, err)
	}
	if _, err := mc.StatObject(ctx, c.s3.Bucket, key, minio.StatObjectOptions{}); err == nil {
		t.Errorf("the killed sandbox's blob is still in the store")
	}
	if err := c.start(a, "http://"+a.addr+"/health"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the api sees A again
	if r, err := c.call(ctx, c.apiKey, "GET", "/sandboxes/"+sb.ID, nil); err != nil || r.status != http.StatusNotFound {
		t.Errorf("the killed sandbox after A's restart: %v %v", r, err)
	}
	if _, err := os.Stat(filepath.Join(a.dataDir, "sandboxes", sb.ID)); err == nil {
		t.Errorf("A kept the files of the sandbox killed while it was lost")
	}
	t.Logf("pause, loss of A, kill through B and A's restart took %s", time.Since(killSteps).Round(time.Millisecond))

	// The credentials are in no log and no answer.
	for _, p := range append(c.nodes, c.api) {
		if logText, _ := os.ReadFile(p.logPath); bytes.Contains(logText, []byte(c.s3.SecretKey)) {
			t.Errorf("%s's log holds the S3 secret key", p.name)
		}
	}
	for _, resp := range []response{r2, r4} {
		if bytes.Contains(resp.body, []byte(c.s3.SecretKey)) || bytes.Contains(resp.body, []byte(c.s3.AccessKey)) {
			t.Errorf("an API answer holds S3 credentials: %s", resp)
		}
	}

	// The same cluster, a node killed at each step (crash_test.go).
	t.Run("CrashAtEveryStep", func(t *testing.T) { crashAtEveryStep(t, c) })
}

func atoi(s string) int {
	n := 0
	for _, ch := range s {
		if ch < '0' || ch > '9' {
			return -1
		}
		n = n*10 + int(ch-'0')
	}
	return n
}
