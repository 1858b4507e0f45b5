package blobstore

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/test/security/internal/seckit"
)

// TestTemplateOutlivesItsNode: a template built on node A (one RUN step
// over base, and a start command, so that its sandboxes are restored
// from a checkpoint with it running) is in the blob store once its
// build is ready; A is killed
// with SIGKILL and its data dir wiped; another team cannot start the
// template by its ID or names; a sandbox of the template paused into the
// store on A resumes on B, which gets the template's layers first; the
// template starts on B from the store with the file its build step
// wrote and its start command running (restored, not booted); A, back
// with its empty data dir, refuses a corrupted blob with an answer that
// says so and keeps nothing of it, then, the blob whole again, starts the
// template from the store too; deleting the template removes its blobs.
func TestTemplateOutlivesItsNode(t *testing.T) {
	c := startCluster(t, nil, false)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	otherKey := c.newTeam(ctx, t, "tmpl-blob-other-team")
	mc := c.s3Client(t)

	// Built on A: B is cordoned, so A is the template's home.
	if err := c.setNode(ctx, b.name, store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the api rereads the nodes every half second
	marker := "built-on-a-" + randHex(8)
	name := "blob-tmpl-" + randHex(4)
	begin := time.Now()
	built := c.buildWithStart(ctx, t, name, "echo "+marker+" > /etc/warren-blob-marker", startCmd, "test -e /tmp/ready")
	t.Logf("built template %s (build %s) in %s", built.TemplateID, built.BuildID, time.Since(begin).Round(time.Millisecond))
	if err := c.setNode(ctx, b.name, store.NodeReady); err != nil {
		t.Fatal(err)
	}
	bd, err := c.st.GetBuild(ctx, built.BuildID)
	if err != nil || bd.Node != a.name || bd.Status != store.BuildReady {
		t.Fatalf("the build: %+v %v (wanted ready, on %s)", bd, err, a.name)
	}
	tpl, err := c.st.GetTemplate(ctx, built.TemplateID)
	if err != nil {
		t.Fatal(err)
	}
	team := tpl.TeamID
	blobs := c.teamBlobs(ctx, t, mc, team)
	t.Logf("the template's blobs in the store once its build was ready: %v", blobs)
	if len(blobs) < 2 {
		t.Errorf("a ready build's image is not in the blob store (%d blobs of team %s; a record and a layer at least were wanted)", len(blobs), team)
	}

	// A sandbox of the template, paused into the store on A: its resume
	// elsewhere needs the template's layers, which only A has.
	paused := c.createFrom(ctx, t, c.apiKey, built.TemplateID)
	if r, err := c.exec(ctx, paused, "echo kept > /home/user/kept"); err != nil || r.exit != 0 {
		t.Fatalf("writing in the sandbox: %+v %v", r, err)
	}
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+paused.ID+"/pause", nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("pause: %v %v", r, err)
	}

	// A is lost with its disk.
	c.kill9(a)
	if err := os.RemoveAll(a.dataDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(a.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := seckit.PopulateDataDir(a.dataDir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lostAfter + time.Second)

	// Another team reaches nothing: by ID, by its own name, by the
	// owner's namespace.
	for _, ref := range []string{built.TemplateID, name, team + "/" + name} {
		r, err := c.call(ctx, otherKey, "POST", "/sandboxes", map[string]any{"templateID": ref, "timeout": 60})
		if err != nil || (r.status != http.StatusNotFound && r.status != http.StatusForbidden) {
			t.Errorf("another team's create of %q: %v %v", ref, r, err)
		}
	}

	// The sandbox paused on A resumes on B, which gets the template's
	// layers first.
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+paused.ID+"/connect", map[string]any{"timeout": 120}); err != nil || r.status != http.StatusCreated {
		t.Errorf("resuming on B a sandbox of a template only the lost A had: %v %v", r, err)
	} else if r, err := c.exec(ctx, paused, "cat /home/user/kept /etc/warren-blob-marker"); err != nil || r.stdout != "kept\n"+marker+"\n" {
		t.Errorf("the resumed sandbox: %+v %v", r, err)
	}
	c.call(ctx, c.apiKey, "DELETE", "/sandboxes/"+paused.ID, nil)

	// It starts on B (the image the resume fetched from the store).
	start := time.Now()
	sb := c.createFrom(ctx, t, c.apiKey, built.TemplateID)
	t.Logf("started on B in %s", time.Since(start).Round(time.Millisecond))
	if rec, err := c.st.GetSandbox(ctx, sb.ID); err != nil || rec.Node != b.name {
		t.Fatalf("the sandbox: %+v %v (wanted on %s)", rec, err, b.name)
	}
	startedOnB := c.checkStarted(ctx, t, sb, marker, "on B")

	// A comes back with its empty data dir (B cordoned).
	if err := c.start(a, "http://"+a.addr+"/health"); err != nil {
		t.Fatal(err)
	}
	if err := c.setNode(ctx, b.name, store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)

	// A corrupted blob (the largest: the checkpoint) is refused, saying
	// so; A keeps nothing of it.
	layerKey := ""
	var layerSize int64
	for k, size := range blobs {
		if size > layerSize {
			layerKey, layerSize = k, size
		}
	}
	if layerKey != "" {
		good := c.getObject(ctx, t, mc, layerKey)
		bad := bytes.Clone(good)
		bad[len(bad)/2] ^= 0xff
		c.putObject(ctx, t, mc, layerKey, bad)
		r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes", map[string]any{"templateID": built.TemplateID, "timeout": 120})
		if err != nil || r.status < 500 || !strings.Contains(string(r.body), "corrupt") {
			t.Errorf("a create from a corrupted layer blob: %v %v (wanted a 5xx saying the blob is corrupt)", r, err)
		} else {
			t.Logf("corrupted blob refused: %s", r)
		}
		if left := pullLeftovers(a.dataDir, built.BuildID); len(left) > 0 {
			t.Errorf("A kept what it fetched of a corrupted blob: %v", left)
		}
		c.putObject(ctx, t, mc, layerKey, good)
	}

	// Whole again, A starts it from the store.
	sbA := c.createFrom(ctx, t, c.apiKey, name)
	if err := c.setNode(ctx, b.name, store.NodeReady); err != nil {
		t.Fatal(err)
	}
	if rec, err := c.st.GetSandbox(ctx, sbA.ID); err != nil || rec.Node != a.name {
		t.Fatalf("the sandbox on the wiped A: %+v %v", rec, err)
	}
	if id := c.checkStarted(ctx, t, sbA, marker, "on the wiped A"); id != startedOnB {
		t.Errorf("the sandboxes on B and A were not both restored from the build's checkpoint: their start commands drew %s and %s", startedOnB, id)
	}

	// Deleted, the template's blobs go.
	for _, id := range []string{sb.ID, sbA.ID} {
		c.call(ctx, c.apiKey, "DELETE", "/sandboxes/"+id, nil)
	}
	if r, err := c.call(ctx, c.apiKey, "DELETE", "/templates/"+built.TemplateID, nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("deleting the template: %v %v", r, err)
	}
	poll.Within(10*time.Second, 200*time.Millisecond, func() bool { return len(c.teamBlobs(ctx, t, mc, team)) == 0 })
	if left := c.teamBlobs(ctx, t, mc, team); len(left) > 0 {
		t.Errorf("the deleted template's blobs stay in the store: %v", left)
	}
}

// teamBlobs lists the keys and sizes of team's blobs in the store.
func (c *cluster) teamBlobs(ctx context.Context, t *testing.T, mc *minio.Client, team string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for o := range mc.ListObjects(ctx, c.s3.Bucket, minio.ListObjectsOptions{Prefix: "warren/teams/" + team + "/sha256/", Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("listing the store: %v", o.Err)
		}
		out[o.Key] = o.Size
	}
	return out
}

func (c *cluster) getObject(ctx context.Context, t *testing.T, mc *minio.Client, key string) []byte {
	t.Helper()
	o, err := mc.GetObject(ctx, c.s3.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	b, err := io.ReadAll(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (c *cluster) putObject(ctx context.Context, t *testing.T, mc *minio.Client, key string, b []byte) {
	t.Helper()
	if _, err := mc.PutObject(ctx, c.s3.Bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createFrom creates a sandbox of template ref with key, wherever the
// api places it.
func (c *cluster) createFrom(ctx context.Context, t *testing.T, key, ref string) sandbox {
	t.Helper()
	r, err := c.call(ctx, key, "POST", "/sandboxes", map[string]any{"templateID": ref, "timeout": 600})
	if err != nil || r.status != http.StatusCreated {
		t.Fatalf("create from %s: %v %v", ref, r, err)
	}
	return decodeSandbox(t, r)
}

// pullLeftovers lists what of build's image a node's data dir holds:
// its record, and layers or checkpoints still being fetched.
func pullLeftovers(dataDir, build string) []string {
	var out []string
	if _, err := os.Stat(filepath.Join(dataDir, "templates", build+".json")); err == nil {
		out = append(out, "templates/"+build+".json")
	}
	for _, d := range []string{"layers", "snapshots", "blobtmp"} {
		entries, _ := os.ReadDir(filepath.Join(dataDir, d))
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".tmp-pull-") || (d == "blobtmp" && e.Name() != "") {
				out = append(out, d+"/"+e.Name())
			}
		}
	}
	slices.Sort(out)
	return out
}

// decodeSandbox is the sandbox a create's 201 answer describes.
func decodeSandbox(t *testing.T, r response) sandbox {
	t.Helper()
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatal(err)
	}
	return sandbox{ID: out.SandboxID, EnvdToken: out.EnvdAccessToken}
}

// startCmd is the template's start command: it counts in the
// background, and says it is ready once it runs. A sandbox restored from
// the template's checkpoint finds it running, with the ID it drew when
// the build started it.
const startCmd = `sh -c 'echo $$ > /tmp/start.pid; cat /proc/sys/kernel/random/uuid > /tmp/start.id; touch /tmp/ready; n=0; while :; do n=$((n+1)); echo $n > /tmp/ticks; sleep 0.1; done'`

type built struct{ TemplateID, BuildID string }

// buildWithStart builds template name from base with one RUN step (as
// root) and a start and ready command, through the api, and waits for
// it to be ready.
func (c *cluster) buildWithStart(ctx context.Context, t *testing.T, name, run, start, ready string) built {
	t.Helper()
	r, err := c.call(ctx, c.apiKey, "POST", "/v3/templates", map[string]any{"name": name})
	var b built
	if err == nil && r.status < 300 {
		err = json.Unmarshal(r.body, &struct {
			TemplateID *string `json:"templateID"`
			BuildID    *string `json:"buildID"`
		}{&b.TemplateID, &b.BuildID})
	}
	if err != nil || b.TemplateID == "" || b.BuildID == "" {
		t.Fatalf("POST /v3/templates: %v %v", r, err)
	}
	spec := map[string]any{
		"fromTemplate": "base",
		"steps": []map[string]any{
			{"type": "USER", "args": []string{"root"}},
			{"type": "RUN", "args": []string{run}},
			{"type": "USER", "args": []string{"user"}},
		},
		"startCmd": start, "readyCmd": ready,
	}
	if r, err := c.call(ctx, c.apiKey, "POST", "/v2/templates/"+b.TemplateID+"/builds/"+b.BuildID, spec); err != nil || r.status >= 300 {
		t.Fatalf("starting the build: %v %v", r, err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		r, err := c.call(ctx, c.apiKey, "GET", "/templates/"+b.TemplateID+"/builds/"+b.BuildID+"/status", nil)
		var st struct {
			Status string `json:"status"`
		}
		if err == nil {
			err = json.Unmarshal(r.body, &st)
		}
		switch {
		case err != nil:
			t.Fatalf("the build's status: %v %v", r, err)
		case st.Status == "ready":
			return b
		case st.Status == "error":
			t.Fatalf("the build failed: %s", r.body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("the build did not end within 3 minutes")
	return b
}

// checkStarted checks a sandbox of the template: the build step's file
// is there, and the start command runs and counts; it returns the ID the
// start command drew (the same in every sandbox restored from the
// template's checkpoint, a new one in a sandbox that booted).
func (c *cluster) checkStarted(ctx context.Context, t *testing.T, sb sandbox, marker, where string) string {
	t.Helper()
	r, err := c.exec(ctx, sb, `cat /etc/warren-blob-marker; kill -0 "$(cat /tmp/start.pid)" && echo running; a=$(cat /tmp/ticks); sleep 0.5; b=$(cat /tmp/ticks); [ "$b" -gt "$a" ] && echo counting; cat /tmp/start.id`)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if err != nil || r.exit != 0 || len(lines) != 4 || lines[0] != marker || lines[1] != "running" || lines[2] != "counting" || lines[3] == "" {
		t.Fatalf("the template's sandbox %s: %v %+v (wanted its build step's file %q, its start command running and counting)", where, err, r, marker)
	}
	return lines[3]
}
