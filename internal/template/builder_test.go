package template

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/buildspec"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/poll"
	"github.com/warren-sandbox/warren/internal/rootfs"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/setup"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// These tests run real builds (runc, for speed) over the base template
// that `warren setup` builds, in a data dir of their own whose only shared
// part is the base layer, so that what they build goes with them.

var (
	fixtureOnce sync.Once
	fixtureErr  error
	envdPath    string
	baseLayer   string
)

func setupFixture(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs real build sandboxes")
	}
	if testing.Short() {
		t.Skip("runs real build sandboxes: not in -short (make check)")
	}
	fixtureOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		if fixtureErr = setup.Run(ctx, setup.Options{Runtimes: []string{"runc"}}, os.Stderr); fixtureErr != nil {
			return
		}
		installed, err := image.Open(setup.DefaultDataDir)
		if err != nil {
			fixtureErr = err
			return
		}
		base, err := installed.Template(baseimage.TemplateID)
		if err != nil {
			fixtureErr = err
			return
		}
		baseLayer = base.Layers[0]
		dir, err := os.MkdirTemp("", "warren-build-envd-")
		if err != nil {
			fixtureErr = err
			return
		}
		envdPath, fixtureErr = testenv.BuildEnvd(dir)
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
}

type env struct {
	t       *testing.T
	st      store.Store
	images  *image.Store
	rt      runtime.Runtime
	nw      *network.Manager
	b       *Builder
	dataDir string
}

// newEnv starts a builder on a data dir holding only the base template.
func newEnv(t *testing.T, st store.Store, options ...func(*Config)) *env {
	t.Helper()
	return newEnvWith(t, st, "runc", options...)
}

// newEnvWith is newEnv on runtime rtName (runc or runsc).
func newEnvWith(t *testing.T, st store.Store, rtName string, options ...func(*Config)) *env {
	t.Helper()
	setupFixture(t)
	dir := t.TempDir()
	images, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := rootfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(setup.DefaultDataDir, "layers", baseLayer), images.LayerDir(baseLayer)); err != nil {
		t.Fatal(err)
	}
	if err := images.PutTemplate(&image.Template{ID: baseimage.TemplateID, Layers: []string{baseLayer}, User: "user", Workdir: "/home/user", Recipe: "test"}); err != nil {
		t.Fatal(err)
	}
	rtCfg := runtime.Config{StateDir: "/run/warren-build-test/" + rtName, CgroupParent: "/warren-build-test"}
	if rtName == "runsc" {
		rtCfg.Binary = setup.RunscPath(setup.DefaultDataDir)
		if _, err := os.Stat(rtCfg.Binary); err != nil {
			t.Skipf("runsc is not installed (%v): `warren setup` installs it", err)
		}
	}
	rt, err := runtime.New(rtName, rtCfg)
	if err != nil {
		t.Fatal(err)
	}
	nw, err := network.New(network.Config{CIDR: netip.MustParsePrefix("10.132.0.0/20"), Prefix: "wbt", PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	testenv.SweepOnce(t, "prefix wbt", func() error { return nw.Cleanup(nil) })
	n, err := node.New(node.Config{Runtime: rt, Network: nw, Rootfs: node.LocalRootfs(roots, images), EnvdPath: envdPath, ResolvConf: "/etc/resolv.conf"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Store: st, Images: images, Node: n, CPUCount: 1, MemoryMB: 256}
	for _, o := range options {
		o(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, st: st, images: images, rt: rt, nw: nw, b: b, dataDir: dir}
	t.Cleanup(func() {
		b.Close()
		nw.Close()
	})
	return e
}

func newStore(t *testing.T) store.Store {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	addTeam(t, st, "t1")
	return st
}

// addTeam adds the team id to the store.
func addTeam(t *testing.T, st store.Store, id string) {
	t.Helper()
	if err := st.CreateTeam(context.Background(), store.Team{ID: id, Name: id, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// build creates a template of team t1 and runs spec, returning its final
// status.
func (e *env) build(name string, spec buildspec.Spec) (Created, Status) {
	e.t.Helper()
	return e.buildAs("t1", name, nil, spec)
}

// buildAs makes a template of team, uploads files (hash → archive) for
// it and runs spec.
func (e *env) buildAs(team, name string, files map[string][]byte, spec buildspec.Spec) (Created, Status) {
	e.t.Helper()
	ctx := context.Background()
	c, err := e.b.Create(ctx, CreateRequest{TeamID: team, Name: name})
	if err != nil {
		e.t.Fatal(err)
	}
	for hash, archive := range files {
		if err := upload(e.t, e.b, team, c.Template.ID, hash, archive); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := e.b.StartBuild(ctx, team, c.Template.ID, c.BuildID, spec); err != nil {
		e.t.Fatal(err)
	}
	return c, e.waitAs(team, c.Template.ID, c.BuildID)
}

// wait waits for a build of team t1 to end (see waitAs).
func (e *env) wait(templateID, buildID string) Status {
	e.t.Helper()
	return e.waitAs("t1", templateID, buildID)
}

// waitAs waits at most 5 minutes for a build of team to end.
func (e *env) waitAs(team, templateID, buildID string) Status {
	e.t.Helper()
	var st Status
	ended := poll.Within(5*time.Minute, 100*time.Millisecond, func() bool {
		var err error
		if st, err = e.b.Status(context.Background(), team, templateID, buildID, 0, 100, ""); err != nil {
			e.t.Fatal(err)
		}
		return st.Build.Status == store.BuildReady || st.Build.Status == store.BuildError
	})
	if !ended {
		e.t.Fatalf("build %s did not end", buildID)
	}
	return st
}

// messages joins a build's log.
func (e *env) messages(buildID string) string {
	logs, err := e.st.BuildLogs(context.Background(), buildID, 0, 100000, "")
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	for _, l := range logs {
		b.WriteString(l.Message + "\n")
	}
	return b.String()
}

// assertNothingLeft checks that no build sandbox, rootfs or unfinished
// layer is left.
func (e *env) assertNothingLeft() {
	e.t.Helper()
	cs, err := e.rt.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	if len(cs) != 0 {
		e.t.Errorf("containers left: %v", cs)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dataDir, "sandboxes")); len(ents) != 0 {
		e.t.Errorf("root filesystems left: %d", len(ents))
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), e.dataDir) {
		e.t.Errorf("mounts left under %s", e.dataDir)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dataDir, "layers")); true {
		for _, x := range ents {
			if strings.HasPrefix(x.Name(), ".") {
				e.t.Errorf("unfinished layer left: %s", x.Name())
			}
		}
	}
}

func TestBuildStepsCacheAndFailure(t *testing.T) {
	e := newEnv(t, newStore(t))
	spec := buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{
		{Type: "ENV", Args: []string{"WHO", "builder"}},
		{Type: "RUN", Args: []string{`echo "$WHO" > /tmp/who && id -un >> /tmp/who`}},
		{Type: "WORKDIR", Args: []string{"/srv/app"}},
		{Type: "RUN", Args: []string{"pwd > where && rm /etc/issue", "root"}},
	}}
	c, st := e.build("steps", spec)
	if st.Build.Status != store.BuildReady {
		t.Fatalf("status %s: %s\n%s", st.Build.Status, st.Build.ReasonMessage, e.messages(c.BuildID))
	}
	img, err := e.images.Template(c.BuildID)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 4 || img.Envs["WHO"] != "builder" || img.Workdir != "/srv/app" || img.User != "user" {
		t.Fatalf("template %+v", img)
	}
	// Each layer holds what its step wrote: files, and a whiteout for
	// a deleted one.
	who, _ := os.ReadFile(filepath.Join(e.images.LayerDir(img.Layers[1]), "tmp", "who"))
	if string(who) != "builder\nuser\n" {
		t.Errorf("/tmp/who = %q", who)
	}
	if fi, err := os.Stat(filepath.Join(e.images.LayerDir(img.Layers[2]), "srv", "app")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("WORKDIR made %v (%v), want it owned by user", fi, err)
	}
	where, _ := os.ReadFile(filepath.Join(e.images.LayerDir(img.Layers[3]), "srv", "app", "where"))
	if string(where) != "/srv/app\n" {
		t.Errorf("where = %q", where)
	}
	var wst syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(e.images.LayerDir(img.Layers[3]), "etc", "issue"), &wst); err != nil || wst.Mode&syscall.S_IFMT != syscall.S_IFCHR || wst.Rdev != 0 {
		t.Errorf("no whiteout for the deleted /etc/issue: %v %+v", err, wst)
	}
	e.assertNothingLeft()

	// The same spec again: every layer step is cached, the same layers.
	c2, st2 := e.build("steps", spec)
	if st2.Build.Status != store.BuildReady {
		t.Fatal(st2.Build.ReasonMessage)
	}
	if got := strings.Count(e.messages(c2.BuildID), "cached"); got != 3 {
		t.Errorf("%d steps cached, want 3:\n%s", got, e.messages(c2.BuildID))
	}
	img2, _ := e.images.Template(c2.BuildID)
	if strings.Join(img2.Layers, ",") != strings.Join(img.Layers, ",") {
		t.Errorf("layers %v, want %v", img2.Layers, img.Layers)
	}
	// A changed ENV changes every later step's key.
	spec.Steps[0].Args[1] = "someone else"
	c3, _ := e.build("steps", spec)
	if got := strings.Count(e.messages(c3.BuildID), "cached"); got != 0 {
		t.Errorf("%d steps cached after an ENV change, want 0", got)
	}

	// A failing step: error, its step, its output, nothing left.
	c4, st4 := e.build("fails", buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{
		{Type: "RUN", Args: []string{"true"}},
		{Type: "RUN", Args: []string{"echo going down; exit 7"}},
	}})
	if st4.Build.Status != store.BuildError || st4.Build.ReasonStep != "2" || !strings.Contains(st4.Build.ReasonMessage, "code 7") {
		t.Errorf("failed build: %+v", st4.Build)
	}
	if !strings.Contains(e.messages(c4.BuildID), "going down") {
		t.Error("the failing step's output is not in the log")
	}
	if _, err := e.b.Resolve(context.Background(), "t1", "fails"); !errors.Is(err, ErrNotFound) {
		t.Errorf("resolving a template without a ready build: %v", err)
	}
	e.assertNothingLeft()
}

// TestBuildStepFillingItsDisk: a RUN step that writes past the build
// sandboxes' disk gets ENOSPC (in its log), the build fails at that step,
// and neither the data dir's file system nor a mount, loop device or
// half-made layer is left.
func TestBuildStepFillingItsDisk(t *testing.T) {
	e := newEnv(t, newStore(t), func(c *Config) { c.BuildDiskMB = 64 })
	c, st := e.build("filler", buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{
		{Type: "RUN", Args: []string{"dd if=/dev/zero of=/big bs=1M count=128", "root"}},
	}})
	if st.Build.Status != store.BuildError || st.Build.ReasonStep != "1" {
		t.Errorf("build: %+v, want an error at step 1", st.Build)
	}
	if msgs := e.messages(c.BuildID); !strings.Contains(msgs, "No space left on device") {
		t.Errorf("no ENOSPC in the log:\n%s", msgs)
	}
	e.assertNothingLeft()
	if loops := loopsBackedBy(e.dataDir); len(loops) > 0 {
		t.Errorf("loop devices left: %v", loops)
	}
	ents, _ := os.ReadDir(filepath.Join(e.dataDir, "layers"))
	if len(ents) != 1 || ents[0].Name() != baseLayer {
		t.Errorf("layers: %v, want only the base", ents)
	}
}

// loopsBackedBy lists loop devices whose backing file is below dir. The
// kernel detaches an auto-clearing one as its file system goes: allow it
// a moment.
func loopsBackedBy(dir string) []string {
	var out []string
	poll.Within(3*time.Second, 20*time.Millisecond, func() bool {
		out = nil
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir+"/") {
				out = append(out, f+": "+strings.TrimSpace(string(b)))
			}
		}
		return len(out) == 0
	})
	return out
}

func TestDeleteCancelsARunningBuild(t *testing.T) {
	e := newEnv(t, newStore(t))
	ctx := context.Background()
	c, err := e.b.Create(ctx, CreateRequest{TeamID: "t1", Name: "slow"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.StartBuild(ctx, "t1", c.Template.ID, c.BuildID, buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{{Type: "RUN", Args: []string{"sleep 600"}}}}); err != nil {
		t.Fatal(err)
	}
	if !poll.Within(10*time.Second, 50*time.Millisecond, func() bool { return strings.Contains(e.messages(c.BuildID), "RUN sleep") }) {
		t.Fatal("the build did not start")
	}
	time.Sleep(500 * time.Millisecond) // the sandbox is up
	if err := e.b.Delete(ctx, "t1", "slow"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.GetBuild(ctx, c.BuildID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("build record after delete: %v", err)
	}
	e.assertNothingLeft()
}

func TestConcurrencyIsBounded(t *testing.T) {
	e := newEnv(t, newStore(t), func(c *Config) { c.Concurrency = 1 })
	ctx := context.Background()
	var ids [2]Created
	for i := range ids {
		c, err := e.b.Create(ctx, CreateRequest{TeamID: "t1", Name: fmt.Sprintf("queued-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.b.StartBuild(ctx, "t1", c.Template.ID, c.BuildID, buildspec.Spec{FromTemplate: "base", Steps: []buildspec.Step{{Type: "RUN", Args: []string{"sleep 1"}, Force: true}}}); err != nil {
			t.Fatal(err)
		}
		ids[i] = c
	}
	// While one builds, the other waits; then both finish.
	sawQueued := false
	for i := 0; i < 100; i++ {
		a, _ := e.st.GetBuild(ctx, ids[0].BuildID)
		b, _ := e.st.GetBuild(ctx, ids[1].BuildID)
		if a.Status == store.BuildBuilding && b.Status == store.BuildBuilding {
			t.Fatal("two builds ran at once with Concurrency 1")
		}
		if (a.Status == store.BuildBuilding && b.Status == store.BuildWaiting) || (b.Status == store.BuildBuilding && a.Status == store.BuildWaiting) {
			sawQueued = true
		}
		if a.Status == store.BuildReady && b.Status == store.BuildReady {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !sawQueued {
		t.Error("never saw one build waiting for the other")
	}
	for _, c := range ids {
		if st := e.wait(c.Template.ID, c.BuildID); st.Build.Status != store.BuildReady {
			t.Errorf("build %s: %s", c.BuildID, st.Build.ReasonMessage)
		}
	}
}

func TestRestartMarksInterruptedBuilds(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	now := time.Now()
	if err := st.CreateTemplate(ctx, store.Template{ID: "tpl1", TeamID: "t1", Names: []string{"x"}, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	started := buildRecord{Tags: []string{"default"}, Spec: &buildspec.Spec{FromTemplate: "base"}}.String()
	for _, b := range []store.Build{
		{ID: "running", TemplateID: "tpl1", Status: store.BuildBuilding, Spec: started},
		{ID: "queued", TemplateID: "tpl1", Status: store.BuildWaiting, Spec: started},
		{ID: "unstarted", TemplateID: "tpl1", Status: store.BuildWaiting, Spec: buildRecord{Tags: []string{"default"}}.String()},
		{ID: "done", TemplateID: "tpl1", Status: store.BuildReady, Spec: started},
	} {
		b.CreatedAt, b.UpdatedAt = now, now
		if err := st.CreateBuild(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	newEnv(t, st) // its Start
	want := map[string]store.BuildStatus{"running": store.BuildError, "queued": store.BuildError, "unstarted": store.BuildWaiting, "done": store.BuildReady}
	for id, status := range want {
		b, err := st.GetBuild(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if b.Status != status {
			t.Errorf("build %s is %s, want %s", id, b.Status, status)
		}
		if status == store.BuildError && !strings.Contains(b.ReasonMessage, "interrupted") {
			t.Errorf("build %s reason %q", id, b.ReasonMessage)
		}
	}
}

// TestBuildFromRegistry pulls an image made from the base rootfs from a
// registry on loopback (go-containerregistry's, in this process), builds
// on it, and runs the result.
func TestBuildFromRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/warren/base:1"
	// Loopback registries must be allowed, as with warren serve
	// --allow-insecure-registry.
	e := newEnv(t, newStore(t), func(c *Config) { c.InsecureRegistries = []string{host, "127.0.0.1:1"} })

	layerDir := filepath.Join(setup.DefaultDataDir, "layers", baseLayer)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return tarDir(layerDir), nil },
		tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{
		Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "FROM_REGISTRY=yes"},
		User: "user", WorkingDir: "/home/user",
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}

	c, st := e.build("pulled", buildspec.Spec{FromImage: ref, Steps: []buildspec.Step{
		{Type: "RUN", Args: []string{`echo "$FROM_REGISTRY $(id -un) $(pwd)" > /home/user/pulled.txt`}},
	}})
	if st.Build.Status != store.BuildReady {
		t.Fatalf("status %s: %s\n%s", st.Build.Status, st.Build.ReasonMessage, e.messages(c.BuildID))
	}
	res, err := e.b.Resolve(context.Background(), "t1", "pulled")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Image.Layers[0], "oci-") || res.Image.User != "user" || res.Image.Envs["FROM_REGISTRY"] != "yes" {
		t.Fatalf("template %+v", res.Image)
	}
	// A sandbox of the template runs and sees the step's file.
	dirs, err := e.images.LayerDirs(res.Image)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := e.b.cfg.Node.Create(context.Background(), node.CreateRequest{ID: sandbox.NewID(), Layers: dirs, User: res.Image.User, Workdir: res.Image.Workdir, AccessToken: "tok-pulled"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.b.remove(inst)
	cl := newEnvdClient(inst, "tok-pulled")
	defer cl.close()
	var out strings.Builder
	code, err := cl.run(context.Background(), execSpec{User: "user", Script: "cat /home/user/pulled.txt", Output: func(_ bool, b []byte) { out.Write(b) }})
	if err != nil || code != 0 || out.String() != "yes user /home/user\n" {
		t.Fatalf("in the sandbox: %d %v %q", code, err, out.String())
	}

	// Offline (nothing listens): the build fails fast at "base" and says
	// what to do.
	start := time.Now()
	_, st = e.build("offline", buildspec.Spec{FromImage: "127.0.0.1:1/nothing/here:1"})
	if st.Build.Status != store.BuildError || st.Build.ReasonStep != "base" || !strings.Contains(st.Build.ReasonMessage, "warren image import") {
		t.Errorf("offline pull: %+v", st.Build)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("an offline pull took %s", time.Since(start))
	}

	// A builder that does not allow the registry refuses it, and says
	// how to allow it.
	strict := newEnv(t, newStore(t))
	_, st = strict.build("refused", buildspec.Spec{FromImage: ref})
	if st.Build.Status != store.BuildError || st.Build.ReasonStep != "base" || !strings.Contains(st.Build.ReasonMessage, "--allow-insecure-registry "+host) {
		t.Errorf("a loopback registry not allowed: %+v", st.Build)
	}
}

// tarDir streams dir as an uncompressed tar (what a layer is).
func tarDir(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			if rel == "." {
				return nil
			}
			link := ""
			if fi.Mode()&os.ModeSymlink != 0 {
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			h.Name = rel
			if fi.IsDir() {
				h.Name += "/"
			}
			st := fi.Sys().(*syscall.Stat_t)
			h.Uid, h.Gid, h.Uname, h.Gname = int(st.Uid), int(st.Gid), "", ""
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				defer f.Close()
				_, err = io.Copy(tw, f)
				return err
			}
			return nil
		})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

// TestCopyAndRunShareTheWorkdir: in an image without WORKDIR, a COPY to a
// relative destination lands where RUN steps run, the home of the build's
// user, as in E2B's builder (it once landed under /, while RUN ran in
// /root); with a USER it is that user's home, with a WORKDIR the workdir.
func TestCopyAndRunShareTheWorkdir(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/warren/noworkdir:1"
	e := newEnv(t, newStore(t), func(c *Config) { c.InsecureRegistries = []string{host} })

	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return tarDir(filepath.Join(setup.DefaultDataDir, "layers", baseLayer)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	// What debian:12 says: neither USER nor WORKDIR.
	if img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}); err != nil {
		t.Fatal(err)
	}
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	const hash = "feedfacefeedface"
	files := map[string][]byte{hash: tarOf(t, map[string]string{"a.txt": "copied\n"})}
	c, st := e.buildAs("t1", "noworkdir", files, buildspec.Spec{FromImage: ref, Steps: []buildspec.Step{
		{Type: "COPY", Args: []string{"a.txt", "rel/a.txt"}, FilesHash: hash},
		{Type: "RUN", Args: []string{`pwd > /tmp/run-pwd && cat rel/a.txt > /tmp/run-saw`}},
		{Type: "USER", Args: []string{"user"}},
		{Type: "COPY", Args: []string{"a.txt", "mine/"}, FilesHash: hash},
		{Type: "RUN", Args: []string{`pwd > /tmp/user-pwd && cat mine/a.txt > /tmp/user-saw`}},
		{Type: "WORKDIR", Args: []string{"/srv/w"}},
		{Type: "COPY", Args: []string{"a.txt", "here.txt"}, FilesHash: hash},
		{Type: "RUN", Args: []string{`pwd > /tmp/w-pwd && cat here.txt > /tmp/w-saw`}},
	}})
	if st.Build.Status != store.BuildReady {
		t.Fatalf("status %s: %s\n%s", st.Build.Status, st.Build.ReasonMessage, e.messages(c.BuildID))
	}
	// Each step's layer holds what it wrote.
	for _, f := range []struct {
		layer      int
		name, want string
	}{
		{1, "root/rel/a.txt", "copied\n"},
		{2, "tmp/run-pwd", "/root\n"},
		{2, "tmp/run-saw", "copied\n"},
		{3, "home/user/mine/a.txt", "copied\n"},
		{4, "tmp/user-pwd", "/home/user\n"},
		{4, "tmp/user-saw", "copied\n"},
		{6, "srv/w/here.txt", "copied\n"},
		{7, "tmp/w-pwd", "/srv/w\n"},
		{7, "tmp/w-saw", "copied\n"},
	} {
		if got := e.layerFile(c.BuildID, f.layer, f.name); got != f.want {
			t.Errorf("layer %d %s = %q, want %q", f.layer, f.name, got, f.want)
		}
	}
}
