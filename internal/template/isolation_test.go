package template

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// Hostile uses of the build cache and of build sandboxes.

// layerFile reads a file of a template's layer i.
func (e *env) layerFile(buildID string, i int, name string) string {
	e.t.Helper()
	img, err := e.images.Template(buildID)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(e.images.LayerDir(img.Layers[i]), name))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

func copySpec(hash string) buildspec.Spec {
	return buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{
		{Type: "COPY", Args: []string{"app.txt", "/srv/app.txt"}, FilesHash: hash},
		{Type: "RUN", Args: []string{"cat /srv/app.txt > /srv/seen", "root"}},
	}}
}

// One team cannot build a step into another team's cache: the same
// steps, files and hash built by two teams make two sets of layers.
func TestLayerCacheIsPerTeam(t *testing.T) {
	st := newStore(t)
	addTeam(t, st, "t2")
	e := newEnv(t, st)
	const hash = "0123456789abcdef"
	c2, s2 := e.buildAs("t2", "attacker", map[string][]byte{hash: tarOf(t, map[string]string{"app.txt": "the same\n"})}, copySpec(hash))
	if s2.Build.Status != store.BuildReady {
		t.Fatalf("t2's build: %s\n%s", s2.Build.ReasonMessage, e.messages(c2.BuildID))
	}
	c1, s1 := e.buildAs("t1", "victim", map[string][]byte{hash: tarOf(t, map[string]string{"app.txt": "the same\n"})}, copySpec(hash))
	if s1.Build.Status != store.BuildReady {
		t.Fatalf("t1's build: %s\n%s", s1.Build.ReasonMessage, e.messages(c1.BuildID))
	}
	if n := strings.Count(e.messages(c1.BuildID), "cached"); n != 0 {
		t.Errorf("t1's build took %d layers from t2's:\n%s", n, e.messages(c1.BuildID))
	}
	i1, _ := e.images.Template(c1.BuildID)
	i2, _ := e.images.Template(c2.BuildID)
	for i := 1; i < len(i1.Layers); i++ {
		if i1.Layers[i] == i2.Layers[i] {
			t.Errorf("layer %d is shared between teams: %s", i, i1.Layers[i])
		}
	}
	if i1.Layers[0] != i2.Layers[0] {
		t.Errorf("the base layer is not shared: %s, %s", i1.Layers[0], i2.Layers[0])
	}
	// The same team's rebuild still hits its cache.
	c3, _ := e.buildAs("t1", "victim", nil, copySpec(hash))
	if n := strings.Count(e.messages(c3.BuildID), "cached"); n != 2 {
		t.Errorf("t1's rebuild: %d layers cached, want 2:\n%s", n, e.messages(c3.BuildID))
	}
	e.assertNothingLeft()
}

// A template of no team (a record gone wrong) cannot build: an empty
// team ID would otherwise be one more shared cache. The store refuses
// to name one, and an empty team finds nothing, so it cannot even be
// started; the cache's own refusal (cacheScope) stays behind that.
func TestBuildWithoutTeamFails(t *testing.T) {
	st := newStore(t)
	e := newEnv(t, st)
	ctx := context.Background()
	now := time.Now()
	tpl := store.Template{ID: "noteam", Names: []string{"noteam"}, CPUCount: 1, MemoryMB: 256, CreatedAt: now, UpdatedAt: now}
	if err := st.CreateTemplate(ctx, tpl); err == nil {
		t.Fatal("the store named a template of no team")
	}
	tpl.Names = nil
	if err := st.CreateTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	id, err := e.b.newBuild(ctx, tpl, buildRecord{Tags: []string{"default"}})
	if err != nil {
		t.Fatal(err)
	}
	spec := buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{{Type: "RUN", Args: []string{"true"}}}}
	for _, team := range []string{"", "t1"} {
		if err := e.b.StartBuild(ctx, team, "noteam", id, spec); !errors.Is(err, ErrNotFound) {
			t.Errorf("team %q started a build of a template of no team: %v", team, err)
		}
	}
	if _, err := cacheScope(""); err == nil {
		t.Error("a cache scope for no team")
	}
	e.assertNothingLeft()
}

// A COPY step's layer is cached by what was uploaded, not by the hash
// the client named it by: other files under a known hash do not get the
// layer of the first ones, and the same files under another hash do.
func TestCopyCacheFollowsTheArchive(t *testing.T) {
	e := newEnv(t, newStore(t))
	const hash = "feedfacefeedface"
	first := tarOf(t, map[string]string{"app.txt": "first\n"})
	c1, s1 := e.buildAs("t1", "one", map[string][]byte{hash: first}, copySpec(hash))
	if s1.Build.Status != store.BuildReady {
		t.Fatalf("%s\n%s", s1.Build.ReasonMessage, e.messages(c1.BuildID))
	}
	c2, s2 := e.buildAs("t1", "two", map[string][]byte{hash: tarOf(t, map[string]string{"app.txt": "second\n"})}, copySpec(hash))
	if s2.Build.Status != store.BuildReady {
		t.Fatalf("%s\n%s", s2.Build.ReasonMessage, e.messages(c2.BuildID))
	}
	if got := e.layerFile(c2.BuildID, 2, "srv/seen"); got != "second\n" {
		t.Errorf("other files under the same hash built %q, want %q:\n%s", got, "second\n", e.messages(c2.BuildID))
	}
	c3, s3 := e.buildAs("t1", "three", map[string][]byte{"otherhash": first}, copySpec("otherhash"))
	if s3.Build.Status != store.BuildReady {
		t.Fatalf("%s\n%s", s3.Build.ReasonMessage, e.messages(c3.BuildID))
	}
	if n := strings.Count(e.messages(c3.BuildID), "cached"); n != 2 {
		t.Errorf("the same files under another hash: %d layers cached, want 2:\n%s", n, e.messages(c3.BuildID))
	}
	e.assertNothingLeft()
}

// A build sandbox's envd wants a token: a request without one, here from
// inside the sandbox, is refused.
func TestBuildSandboxEnvdNeedsAToken(t *testing.T) {
	e := newEnv(t, newStore(t))
	probe := `exec 3<>/dev/tcp/127.0.0.1/49983 && printf 'GET /envs HTTP/1.0\r\nHost: envd\r\n\r\n' >&3 && head -n1 <&3 | tr -d '\r' > /probe`
	c, s := e.build("probe", buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{{Type: "RUN", Args: []string{probe, "root"}}}})
	if s.Build.Status != store.BuildReady {
		t.Fatalf("%s\n%s", s.Build.ReasonMessage, e.messages(c.BuildID))
	}
	if got := e.layerFile(c.BuildID, 1, "probe"); !strings.Contains(got, " 401 ") {
		t.Errorf("envd answered a request without a token with %q, want 401", got)
	}
}

// A start-command snapshot is taken of an envd with a token of its own,
// which the template records: a restored sandbox's envd refuses requests
// without it, and /init with it hands the sandbox its own token.
func TestSnapshotKeepsItsEnvdToken(t *testing.T) {
	e := newEnvWith(t, newStore(t), "runsc")
	spec := buildspec.Spec{FromTemplate: "base", StartCmd: "echo started > /tmp/started; sleep infinity", ReadyCmd: "test -f /tmp/started"}
	c, s := e.build("snap", spec)
	if s.Build.Status != store.BuildReady {
		t.Fatalf("%s\n%s", s.Build.ReasonMessage, e.messages(c.BuildID))
	}
	img, err := e.images.Template(c.BuildID)
	if err != nil {
		t.Fatal(err)
	}
	if img.Snapshot == "" || len(img.SnapshotToken) < 32 {
		t.Fatalf("template %+v: want a snapshot and its envd's token", img)
	}
	for _, p := range []string{filepath.Join(e.dataDir, "templates", c.BuildID+".json"), filepath.Join(e.images.SnapshotDir(img.Snapshot), snapshotTokenFile)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", p, fi.Mode(), err)
		}
	}

	dirs, err := e.images.LayerDirs(img)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inst, err := e.b.cfg.Node.Restore(ctx, node.CreateRequest{ID: sandbox.NewID(), Layers: dirs, CPUCount: 1, MemoryMB: 256,
		AccessToken: img.SnapshotToken, User: img.User, Workdir: img.Workdir}, e.images.SnapshotDir(img.Snapshot))
	if err != nil {
		t.Fatal(err)
	}
	defer e.b.remove(inst)
	status := func(method, path, token, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, inst.EnvdURL()+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := status("GET", "/envs", "", ""); got != http.StatusUnauthorized {
		t.Errorf("the restored envd answered a request without a token: %d, want 401", got)
	}
	if got := status("POST", "/init", "wrong", `{"accessToken":"mine"}`); got != http.StatusUnauthorized {
		t.Errorf("/init with a wrong token: %d, want 401", got)
	}
	if got := status("POST", "/init", img.SnapshotToken, `{"accessToken":"the-sandbox-token"}`); got/100 != 2 {
		t.Fatalf("/init with the template's token: %d", got)
	}
	if got := status("GET", "/envs", img.SnapshotToken, ""); got != http.StatusUnauthorized {
		t.Errorf("the build's token after /init: %d, want 401", got)
	}
	if got := status("GET", "/envs", "the-sandbox-token", ""); got != http.StatusOK {
		t.Errorf("the sandbox's own token: %d, want 200", got)
	}

	// A rebuild finds the snapshot cached and records the same token.
	c2, s2 := e.build("snap", spec)
	if s2.Build.Status != store.BuildReady {
		t.Fatalf("%s\n%s", s2.Build.ReasonMessage, e.messages(c2.BuildID))
	}
	img2, _ := e.images.Template(c2.BuildID)
	if img2.Snapshot != img.Snapshot || img2.SnapshotToken != img.SnapshotToken {
		t.Errorf("cached snapshot: %s %q, want %s and the same token", img2.Snapshot, img2.SnapshotToken, img.Snapshot)
	}
}
