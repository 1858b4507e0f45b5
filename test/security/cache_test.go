package security

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/templateclient"
)

// The layer cache must never hand one team's layer to another: team B's
// build of the same inputs runs its own steps.
func TestCrossTeamCacheReuse(t *testing.T) {
	afterCase(t)
	cmd := "echo same-input > /same.txt"
	buildRun := func(tm team, name string) built {
		b := linkTemplate(t, tm, name, cmd)
		if b.Err != nil {
			t.Fatalf("building %s: %v\n%s", name, b.Err, b.log())
		}
		return b
	}
	a1 := buildRun(S.teamA, "sec-cache-a1")
	// Control: the same team's identical rebuild is cached, so the test
	// can see reuse.
	a2 := buildRun(S.teamA, "sec-cache-a2")
	if !strings.Contains(a2.stepLogs("1"), "cached") {
		t.Fatalf("control failed: team A's identical rebuild was not cached, so reuse cannot be told:\n%s", a2.log())
	}
	b := buildRun(S.teamB, "sec-cache-b")
	if strings.Contains(b.stepLogs("1"), "cached") {
		t.Errorf("team B's step was served from the cache team A filled:\n%s", b.stepLogs("1"))
	}
	la, lb := ownLayers(t, a1.BuildID), ownLayers(t, b.BuildID)
	for _, l := range lb {
		if slices.Contains(la, l) {
			t.Errorf("team B's template uses team A's layer %s", l)
		}
	}
	removeLayers(t, append(la, lb...))
}

// Team A uploads its own files under the filesHash that team B's COPY
// will have, and builds B's exact steps first; B then builds its real
// files with the SDK's call sequence. B's sandbox must see B's files.
func TestCrossTeamCachePoisoningThroughFilesHash(t *testing.T) {
	afterCase(t)
	dockerfile := "FROM base\nCOPY app.txt /srv/app.txt\n"
	genuine := "genuine, from team B\n"
	spec := victimSpec(t, dockerfile, map[string]string{"app.txt": genuine})
	var hash string
	for _, st := range spec["steps"].([]any) {
		if m := st.(map[string]any); m["type"] == "COPY" {
			hash, _ = m["filesHash"].(string)
		}
	}
	if hash == "" {
		t.Fatalf("the SDK's request has no COPY filesHash: %v", spec)
	}

	// The attacker: B's steps, B's hash, A's files.
	rb, r := newRawBuild(t, S.teamA, "sec-poison-a", nil)
	if rb == nil {
		t.Fatalf("POST /v3/templates: %s", r)
	}
	poison := []entry{file("app.txt", "POISON, from team A\n")}
	up := rb.upload(t, hash, tarOf(t, poison))
	attacked := up.Status == http.StatusCreated
	if attacked {
		r, err := S.srv.call(context.Background(), S.teamA, "POST", "/v2/templates/"+rb.TemplateID+"/builds/"+rb.BuildID, spec)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == http.StatusAccepted {
			a := rb.wait(t)
			t.Logf("the attacker's build: %s %v", a.Status, a.Err)
			if a.Err == nil {
				defer removeLayers(t, ownLayers(t, a.BuildID))
			}
		} else {
			checkErrorBody(t, r)
			t.Logf("the attacker's build was refused: %s", r)
		}
	} else {
		checkErrorBody(t, up)
		t.Logf("the attacker's upload was refused: %s", up)
	}

	// The victim.
	b := mustBuild(t, S.teamB, "sec-poison-b", dockerfile, map[string]string{"app.txt": genuine})
	defer removeLayers(t, ownLayers(t, b.BuildID))
	sb := mustCreate(t, S.teamB, createOpts{Template: b.TemplateID})
	if got := sb.ok(t, "user", "cat /srv/app.txt"); got != genuine {
		t.Errorf("team B's template holds team A's files: /srv/app.txt is %q, want %q", got, genuine)
	}
}

// victimSpec returns the build request (POST /v2/templates/…/builds/…)
// that the SDK's call sequence sends for dockerfile and files, by running
// internal/templateclient against a stand-in server that records it.
func victimSpec(t *testing.T, dockerfile string, files map[string]string) map[string]any {
	t.Helper()
	var spec map[string]any
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "POST" && r.URL.Path == "/v3/templates":
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"templateID":"tpl","buildID":"bld"}`)
		case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/templates/tpl/files/"):
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"present":true}`)
		case r.Method == "POST" && r.URL.Path == "/v2/templates/tpl/builds/bld":
			json.NewDecoder(r.Body).Decode(&spec)
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"code":400,"message":"recorded"}`)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer fake.Close()
	dir := t.TempDir()
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	templateclient.New(fake.URL, "e2b_unused").Build(ctx, templateclient.BuildOptions{Name: "victim", Dockerfile: dockerfile, ContextDir: dir})
	if spec == nil {
		t.Fatal("the SDK's call sequence did not reach the build start")
	}
	return spec
}
