package security

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// Issue 13: pause, resume, snapshots and fork are scoped by team, bounded,
// and validate what they are given; a paused sandbox's checkpoint lives on
// the host, out of the sandbox's reach, and goes with a kill.

// sandboxState is what the API says of sb's state, as its own team.
func sandboxState(t *testing.T, sb *sandbox) string {
	t.Helper()
	r := callOK(t, sb.team, "GET", "/sandboxes/"+sb.ID, nil, http.StatusOK)
	var info struct{ State string }
	if err := r.decode(&info); err != nil {
		t.Fatal(err)
	}
	return info.State
}

// callOK sends a request and fails the test unless the status is want;
// an error answer must have E2B's shape.
func callOK(t *testing.T, tm team, method, path string, body any, want int) apiResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := S.srv.call(ctx, tm, method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	checkErrorBody(t, r)
	if r.Status != want {
		t.Fatalf("%s %s: %s, want %d", method, path, r, want)
	}
	return r
}

func TestLifecycleOfAnotherTeamsSandbox(t *testing.T) {
	afterCase(t)
	victim := mustCreate(t, S.teamA, createOpts{AutoResume: true})
	p := "/sandboxes/" + victim.ID
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"POST", p + "/pause", map[string]any{}},
		{"POST", p + "/resume", map[string]any{"timeout": 60}},
		{"POST", p + "/connect", map[string]any{"timeout": 60}},
		{"POST", "/v2" + p + "/connect", map[string]any{"timeout": 60}},
		{"POST", p + "/fork", map[string]any{"count": 2}},
		{"POST", p + "/snapshots", map[string]any{"name": "stolen"}},
	} {
		callOK(t, S.teamB, c.method, c.path, c.body, http.StatusNotFound)
	}
	if st := sandboxState(t, victim); st != "running" {
		t.Fatalf("the victim is %s after another team's calls", st)
	}
	if r := callOK(t, S.teamB, "GET", "/snapshots?sandboxID="+victim.ID, nil, http.StatusOK); strings.TrimSpace(string(r.Body)) != "[]" {
		t.Errorf("another team lists snapshots of the victim: %s", r)
	}

	// Paused, it is still not theirs: they cannot resume, connect to or
	// kill it, and the proxy does not resume it for their traffic without
	// its tokens.
	callOK(t, S.teamA, "POST", p+"/pause", map[string]any{}, http.StatusNoContent)
	callOK(t, S.teamB, "POST", p+"/resume", map[string]any{}, http.StatusNotFound)
	callOK(t, S.teamB, "POST", p+"/connect", map[string]any{"timeout": 60}, http.StatusNotFound)
	callOK(t, S.teamB, "DELETE", p, nil, http.StatusNotFound)
	callOK(t, S.teamB, "POST", p+"/pause", map[string]any{}, http.StatusNotFound)
	if r := callOK(t, S.teamB, "GET", "/v2/sandboxes?state=paused", nil, http.StatusOK); strings.Contains(string(r.Body), victim.ID) {
		t.Errorf("another team lists the paused victim: %s", r)
	}
	if st := sandboxState(t, victim); st != "paused" {
		t.Fatalf("the victim is %s after another team's calls while paused", st)
	}
	callOK(t, S.teamA, "POST", p+"/connect", map[string]any{"timeout": 60}, http.StatusCreated)
}

func TestSnapshotOfAnotherTeam(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	r := callOK(t, S.teamA, "POST", "/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "sec-snap-a"}, http.StatusCreated)
	var snap struct {
		SnapshotID string
		Names      []string
	}
	if err := r.decode(&snap); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		S.srv.call(ctx, S.teamA, "DELETE", "/templates/"+snap.SnapshotID, nil)
	})
	// Another team can neither start, list, name over nor delete it.
	for _, ref := range []string{snap.SnapshotID, "sec-snap-a", "sec-snap-a:default"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if other, err := S.srv.createSandbox(ctx, S.teamB, createOpts{Template: ref}); err == nil {
			killSandbox(t, other)
			t.Errorf("team B started a sandbox from team A's snapshot %q", ref)
		} else if se, ok := err.(*statusError); !ok || (se.r.Status != 404 && se.r.Status != 403) {
			t.Errorf("team B creating from %q: %v, want 404 or 403", ref, err)
		} else {
			checkErrorBody(t, se.r)
		}
		cancel()
	}
	if r := callOK(t, S.teamB, "GET", "/snapshots", nil, http.StatusOK); strings.Contains(string(r.Body), snap.SnapshotID) ||
		strings.Contains(string(r.Body), "sec-snap-a") {
		t.Errorf("team B lists team A's snapshot: %s", r)
	}
	other := mustCreate(t, S.teamB, createOpts{})
	callOK(t, S.teamB, "DELETE", "/templates/"+snap.SnapshotID, nil, http.StatusNotFound)
	// Names are per team: B may give its own snapshot the same name (a
	// 409 would tell B that another team has it), and that takes nothing
	// of A's.
	rb := callOK(t, S.teamB, "POST", "/sandboxes/"+other.ID+"/snapshots", map[string]any{"name": "sec-snap-a"}, http.StatusCreated)
	var own struct{ SnapshotID string }
	if err := rb.decode(&own); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		S.srv.call(ctx, S.teamB, "DELETE", "/templates/"+own.SnapshotID, nil)
	})
	if r := callOK(t, S.teamA, "GET", "/snapshots?name=sec-snap-a", nil, http.StatusOK); !strings.Contains(string(r.Body), snap.SnapshotID) {
		t.Errorf("team A's snapshot is gone after team B's calls: %s", r)
	}
	if sb := mustCreate(t, S.teamA, createOpts{Template: "sec-snap-a"}); sb.ID == "" {
		t.Error("team A cannot start its snapshot by name after team B named one alike")
	} else {
		killSandbox(t, sb)
	}
}

func TestLifecycleBoundsAndNames(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	p := "/sandboxes/" + sb.ID
	for _, body := range []any{
		map[string]any{"count": 0},
		map[string]any{"count": -1},
		map[string]any{"count": 101},
		map[string]any{"count": 1 << 40},
		map[string]any{"timeout": -5},
		map[string]any{"count": "3"},
	} {
		callOK(t, S.teamA, "POST", p+"/fork", body, http.StatusBadRequest)
	}
	for _, name := range []string{"../../etc", "a/../../b", "UPPER", "x:bad tag", strings.Repeat("a", 300), "base", "snap\x00x"} {
		callOK(t, S.teamA, "POST", p+"/snapshots", map[string]any{"name": name}, 0+statusForName(name))
	}
	for _, q := range []string{"limit=0", "limit=101", "nextToken=..%2F..%2Fx", "sandboxID=" + strings.Repeat("x", 300)} {
		callOK(t, S.teamA, "GET", "/snapshots?"+q, nil, http.StatusBadRequest)
	}
	callOK(t, S.teamA, "POST", p+"/pause", map[string]any{"memory": "yes"}, http.StatusBadRequest)
	if st := sandboxState(t, sb); st != "running" {
		t.Errorf("after refused calls the sandbox is %s", st)
	}
}

// statusForName is what a snapshot name gets: the built-in template's
// name is taken (409), the others are malformed (400).
func statusForName(name string) int {
	if name == "base" {
		return http.StatusConflict
	}
	return http.StatusBadRequest
}

// TestPausedCheckpointIsOutOfReach: what a pause writes lives in the data
// dir, not in anything the sandbox can see or change, and a kill of the
// paused sandbox removes it.
func TestPausedCheckpointIsOutOfReach(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	sb.ok(t, "user", "echo kept > /home/user/mark")
	callOK(t, S.teamA, "POST", "/sandboxes/"+sb.ID+"/pause", map[string]any{}, http.StatusNoContent)
	rec, err := S.srv.sandboxRecord(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Checkpoint == "" || rec.RootfsDir == "" || !strings.HasPrefix(rec.Checkpoint, S.srv.dataDir+"/") {
		t.Fatalf("paused record: checkpoint %q, rootfs %q (data dir %s)", rec.Checkpoint, rec.RootfsDir, S.srv.dataDir)
	}
	if !exists(rec.Checkpoint) {
		t.Fatalf("the checkpoint %s is not on disk", rec.Checkpoint)
	}
	if fi, err := os.Stat(rec.Checkpoint); err == nil && fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("the checkpoint %s is %v: readable beyond root", rec.Checkpoint, fi.Mode().Perm())
	}
	callOK(t, S.teamA, "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 60}, http.StatusCreated)
	// The sandbox cannot find its checkpoint from inside.
	if out := sb.ok(t, "root", "cat /home/user/mark; find / -xdev -name 'checkpoint*' -path '*"+sb.ID+"*' 2>/dev/null | head -3"); strings.TrimSpace(out) != "kept" {
		t.Errorf("inside the resumed sandbox: %q", out)
	}
	callOK(t, S.teamA, "POST", "/sandboxes/"+sb.ID+"/pause", map[string]any{}, http.StatusNoContent)
	rec, err = S.srv.sandboxRecord(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	killSandbox(t, sb)
	for _, p := range []string{rec.Checkpoint, rec.RootfsDir} {
		if p != "" && exists(p) {
			t.Errorf("the killed paused sandbox left %s", p)
		}
	}
}
