package blobstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/store"
)

// TestSnapshotsAndForksOutliveTheirNode: a snapshot taken on node A is
// in the blob store (a blob of its team, named by its record) when it is
// answered; the sandbox, changed, is paused into the store and A is
// killed with SIGKILL. Another team can neither create from the snapshot
// nor fork the sandbox (404); a corrupted snapshot blob is refused; the
// team creates from the snapshot on B
// (its file from before the snapshot, its process running) and forks
// the paused sandbox on B (the child has the file as it was paused, and
// the parent stays paused, now B's, and resumes); deleting the snapshot
// deletes its record and its blob.
func TestSnapshotsAndForksOutliveTheirNode(t *testing.T) {
	c := startCluster(t, nil, false)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	const other = "snap-other-team"
	c.newTeam(ctx, t, other)
	mc := c.s3Client(t)

	parent := c.createOn(ctx, t, a.name)
	if r, err := c.exec(ctx, parent, `echo before-snapshot > /home/user/note.txt; nohup sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/sleeper.pid`); err != nil || r.exit != 0 {
		t.Fatalf("setting up the sandbox: %v %+v", err, r)
	}
	start := time.Now()
	r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+parent.ID+"/snapshots", map[string]any{"name": "outlives-a"})
	if err != nil || r.status != http.StatusCreated {
		t.Fatalf("snapshot: %v %v", r, err)
	}
	t.Logf("snapshot on A with its upload took %s", time.Since(start).Round(time.Millisecond))
	var info struct{ SnapshotID string }
	if err := json.Unmarshal(r.body, &info); err != nil {
		t.Fatal(err)
	}
	rec, err := c.st.GetSandbox(ctx, parent.ID)
	if err != nil {
		t.Fatal(err)
	}
	team := rec.TeamID
	tmpl, err := c.st.TemplateByName(ctx, team, "outlives-a")
	if err != nil {
		t.Fatal(err)
	}
	builds, err := c.st.ListBuilds(ctx, tmpl.ID)
	if err != nil || len(builds) != 1 {
		t.Fatalf("the snapshot's builds: %+v %v", builds, err)
	}
	key := ""
	if sb, err := c.st.GetSnapshotBlob(ctx, team, builds[0].ID); err != nil {
		t.Errorf("the snapshot has no record of a blob: %v", err)
	} else {
		key = "warren/teams/" + team + "/sha256/" + strings.TrimPrefix(sb.Blob, "sha256:")
		if st, err := mc.StatObject(ctx, c.s3.Bucket, key, minio.StatObjectOptions{}); err != nil {
			t.Errorf("the snapshot's blob is not in the store at %s: %v", key, err)
		} else {
			t.Logf("snapshot blob %s: %d bytes", sb.Blob, st.Size)
		}
	}

	// The sandbox changes after its snapshot, and is paused into the
	// store; then A is lost.
	if r, err := c.exec(ctx, parent, `echo after-snapshot > /home/user/note.txt`); err != nil || r.exit != 0 {
		t.Fatalf("changing the sandbox: %v %+v", err, r)
	}
	if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+parent.ID+"/pause", nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("pause: %v %v", r, err)
	}
	c.kill9(a)
	time.Sleep(lostAfter + time.Second)

	// Another team reaches neither.
	for _, call := range []struct{ path, what string }{
		{"/sandboxes", info.SnapshotID}, {"/sandboxes", tmpl.ID}, {"/sandboxes/" + parent.ID + "/fork", ""},
	} {
		body := map[string]any{"templateID": call.what, "timeout": 60}
		if call.what == "" {
			body = map[string]any{"timeout": 60}
		}
		if r, err := c.call(ctx, c.otherKey, "POST", call.path, body); err != nil || r.status != http.StatusNotFound || strings.Contains(string(r.body), "127.0.0.1") {
			t.Errorf("another team's POST %s %s: %v %v", call.path, call.what, r, err)
		}
	}

	// checkChild checks a sandbox restored on B: its file as expected, its
	// process from before running.
	checkChild := func(what string, sb sandbox, note string) {
		t.Helper()
		if got, err := c.st.GetSandbox(ctx, sb.ID); err != nil || got.Node != b.name || got.State != store.StateRunning {
			t.Errorf("%s: %+v %v", what, got, err)
			return
		}
		r, err := c.exec(ctx, sb, `cat /home/user/note.txt; kill -0 $(cat /tmp/sleeper.pid) && echo alive`)
		if err != nil || r.exit != 0 || r.stdout != note+"\nalive\n" {
			t.Errorf("%s: %v %+v, want %q and the process alive", what, err, r, note)
		}
	}

	// A corrupted snapshot blob is refused, and nothing is started from
	// it; the whole one back, the create goes through.
	if key != "" {
		good := filepath.Join(t.TempDir(), "blob")
		if err := mc.FGetObject(ctx, c.s3.Bucket, key, good, minio.GetObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		goodBytes, _ := os.ReadFile(good)
		bad := bytes.Clone(goodBytes)
		bad[len(bad)/2] ^= 0xff
		if _, err := mc.PutObject(ctx, c.s3.Bucket, key, bytes.NewReader(bad), int64(len(bad)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes", map[string]any{"templateID": info.SnapshotID, "timeout": 120})
		if err != nil || r.status < 500 {
			t.Errorf("create from a corrupted snapshot blob: %v %v", r, err)
		} else {
			t.Logf("create from a corrupted snapshot blob refused: %s", r)
		}
		if n, err := c.st.CountSandboxes(ctx, store.SandboxFilter{Teams: store.ForTeam(team), States: []store.SandboxState{store.StateRunning, store.StateCreating}}); err != nil || n[b.name] != 0 {
			t.Errorf("running after the refused create: %v %v", n, err)
		}
		if _, err := mc.PutObject(ctx, c.s3.Bucket, key, bytes.NewReader(goodBytes), int64(len(goodBytes)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	start = time.Now()
	r, err = c.call(ctx, c.apiKey, "POST", "/sandboxes", map[string]any{"templateID": info.SnapshotID, "timeout": 120})
	if err != nil || r.status != http.StatusCreated {
		t.Errorf("create from the snapshot of a lost node: %v %v", r, err)
	} else {
		t.Logf("create from the snapshot on B (fetched from the store) took %s", time.Since(start).Round(time.Millisecond))
		checkChild("created from the snapshot on B", parseSandbox(t, r.body), "before-snapshot")
	}

	start = time.Now()
	r, err = c.call(ctx, c.apiKey, "POST", "/sandboxes/"+parent.ID+"/fork", map[string]any{"timeout": 120})
	var forked []struct {
		Sandbox *json.RawMessage `json:"sandbox"`
		Error   *json.RawMessage `json:"error"`
	}
	if err != nil || r.status != http.StatusCreated || json.Unmarshal(r.body, &forked) != nil || len(forked) != 1 || forked[0].Sandbox == nil {
		t.Errorf("fork of a sandbox paused in the store by a lost node: %v %v", r, err)
	} else {
		t.Logf("fork on B (taken over from the store) took %s", time.Since(start).Round(time.Millisecond))
		checkChild("forked on B", parseSandbox(t, *forked[0].Sandbox), "after-snapshot")
		if got, err := c.st.GetSandbox(ctx, parent.ID); err != nil || got.State != store.StatePaused || got.Node != b.name || got.PausedBlob == "" {
			t.Errorf("the forked parent: %+v %v", got, err)
		}
		time.Sleep(time.Second) // the api's view of the parent's node
		if r, err := c.call(ctx, c.apiKey, "POST", "/sandboxes/"+parent.ID+"/connect", map[string]any{"timeout": 120}); err != nil || r.status != http.StatusCreated {
			t.Errorf("connect to the forked parent: %v %v", r, err)
		} else {
			checkChild("the forked parent, resumed", parent, "after-snapshot")
		}
	}

	// Deleting the snapshot deletes its record and its blob.
	if r, err := c.call(ctx, c.apiKey, "DELETE", "/templates/"+tmpl.ID, nil); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("delete the snapshot: %v %v", r, err)
	}
	if _, err := c.st.GetSnapshotBlob(ctx, team, builds[0].ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the deleted snapshot's record stays: %v", err)
	}
	if key != "" {
		poll.Within(10*time.Second, 100*time.Millisecond, func() bool {
			_, err := mc.StatObject(ctx, c.s3.Bucket, key, minio.StatObjectOptions{})
			return err != nil
		})
		if _, err := mc.StatObject(ctx, c.s3.Bucket, key, minio.StatObjectOptions{}); err == nil {
			t.Errorf("the deleted snapshot's blob is still in the store")
		}
	}
}

// parseSandbox reads a sandbox from a create's (or a fork child's) JSON.
func parseSandbox(t *testing.T, body []byte) sandbox {
	t.Helper()
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.SandboxID == "" {
		t.Fatalf("a sandbox in %s: %v", body, err)
	}
	return sandbox{ID: out.SandboxID, EnvdToken: out.EnvdAccessToken}
}
