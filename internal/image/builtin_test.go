package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeRecipe is a template whose layer build is counted and controllable.
type fakeRecipe struct {
	builds atomic.Int32
	fail   error
	delay  time.Duration
}

func (f *fakeRecipe) build(ctx context.Context, dir string, step StepFunc, _ io.Writer) error {
	f.builds.Add(1)
	step("fake build")
	if err := os.WriteFile(filepath.Join(dir, "half"), []byte("x"), 0o644); err != nil {
		return err
	}
	select {
	case <-time.After(f.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	if f.fail != nil {
		return f.fail
	}
	return os.WriteFile(filepath.Join(dir, "done"), []byte("x"), 0o644)
}

func TestEnsureTemplateBuildsOnceForConcurrentCallers(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRecipe{delay: 300 * time.Millisecond}
	want := Template{ID: "fake", Recipe: "r1", User: "user"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	results := make([]*Template, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = s.EnsureTemplate(ctx, want, f.build, nil)
		}()
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil || results[i] == nil || results[i].Layers[0] != "fake-r1" {
			t.Fatalf("caller %d: %+v %v", i, results[i], errs[i])
		}
	}
	if n := f.builds.Load(); n != 1 {
		t.Errorf("%d builds for 4 concurrent callers", n)
	}
	if _, err := os.Stat(filepath.Join(s.LayerDir("fake-r1"), "done")); err != nil {
		t.Error(err)
	}
	// A new recipe builds a new layer beside the old one.
	if _, err := s.EnsureTemplate(ctx, Template{ID: "fake", Recipe: "r2"}, f.build, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Template("fake"); got == nil || got.Layers[0] != "fake-r2" || f.builds.Load() != 2 {
		t.Errorf("after a recipe change: %+v, %d builds", got, f.builds.Load())
	}
	if _, err := os.Stat(s.LayerDir("fake-r1")); err != nil {
		t.Errorf("old layer removed: %v", err)
	}
}

func TestEnsureTemplateInterruptedNeverLooksComplete(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want := Template{ID: "fake", Recipe: "r1"}
	ctx := context.Background()

	// A failing build leaves no layer, no template, no build directory.
	boom := errors.New("boom")
	if _, err := s.EnsureTemplate(ctx, want, (&fakeRecipe{fail: boom}).build, nil); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	// So does a cancelled one.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.EnsureTemplate(cctx, want, (&fakeRecipe{delay: time.Minute}).build, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(s.Dir(), "layers"))
	if len(entries) != 0 {
		t.Errorf("layers/ after failed builds: %v", entries)
	}
	if _, err := s.Template("fake"); !errors.Is(err, ErrNotFound) {
		t.Errorf("template after failed builds: %v", err)
	}

	// A crash mid-build (the process died: its build dir stays) is
	// replaced by the next build.
	crashed := filepath.Join(s.Dir(), "layers", ".build-fake")
	os.MkdirAll(crashed, 0o755)
	os.WriteFile(filepath.Join(crashed, "half"), nil, 0o644)
	f := &fakeRecipe{}
	tmpl, err := s.EnsureTemplate(ctx, want, f.build, nil)
	if err != nil || f.builds.Load() != 1 {
		t.Fatalf("after a crash: %+v %v, %d builds", tmpl, err, f.builds.Load())
	}
	if _, err := os.Stat(crashed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("crashed build dir left: %v", err)
	}

	// A crash after the rename, before the template: the layer is whole
	// and only the template is written.
	os.Remove(filepath.Join(s.Dir(), "templates", "fake.json"))
	if _, err := s.EnsureTemplate(ctx, want, f.build, nil); err != nil || f.builds.Load() != 1 {
		t.Fatalf("template rewrite: %v, %d builds", err, f.builds.Load())
	}
	if got, err := s.Template("fake"); err != nil || got.Layers[0] != "fake-r1" {
		t.Errorf("template %+v %v", got, err)
	}
}

func TestBuildProgressLines(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := s.EnsureTemplate(context.Background(), Template{ID: "fake", Recipe: "r1"}, (&fakeRecipe{}).build, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[fake", "s] building layer fake-r1", "s] fake build", "s] template fake ready"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, out.String())
		}
	}
}

// A built-in template's start snapshot is recorded only over the layers
// it was taken of, survives the next EnsureTemplate of the same recipe,
// and goes with a new recipe.
func TestSetBuiltinSnapshot(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &fakeRecipe{}
	want := Template{ID: "fake", Recipe: "r1", User: "user"}
	built, err := s.EnsureTemplate(ctx, want, f.build, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetBuiltinSnapshot(ctx, "fake", built.Layers, "snap-a", "tok"); err == nil {
		t.Fatal("a snapshot whose image and layer do not exist was recorded")
	}
	for _, d := range []string{s.LayerDir("snap-a"), s.SnapshotDir("snap-a")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetBuiltinSnapshot(ctx, "fake", []string{"other"}, "snap-a", "tok"); !errors.Is(err, ErrTemplateChanged) {
		t.Fatalf("over other layers: %v, want ErrTemplateChanged", err)
	}
	if got, _ := s.Template("fake"); got.Snapshot != "" {
		t.Fatalf("recorded over other layers: %+v", got)
	}
	if err := s.SetBuiltinSnapshot(ctx, "fake", built.Layers, "snap-a", "tok"); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Template("fake")
	if got.Snapshot != "snap-a" || got.SnapshotToken != "tok" || len(got.Layers) != 2 || got.Layers[1] != "snap-a" {
		t.Fatalf("recorded: %+v", got)
	}
	// Recording again over the same built layers keeps one snapshot layer.
	if err := s.SetBuiltinSnapshot(ctx, "fake", built.Layers, "snap-a", "tok"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Template("fake"); len(got.Layers) != 2 {
		t.Fatalf("recorded twice: %+v", got)
	}
	// The same recipe is current, snapshot included: no rebuild.
	again, err := s.EnsureTemplate(ctx, want, f.build, nil)
	if err != nil || again.Snapshot != "snap-a" || f.builds.Load() != 1 {
		t.Fatalf("same recipe: %+v %v, %d builds", again, err, f.builds.Load())
	}
	// A new recipe makes a template without the old snapshot.
	next, err := s.EnsureTemplate(ctx, Template{ID: "fake", Recipe: "r2", User: "user"}, f.build, nil)
	if err != nil || next.Snapshot != "" || next.SnapshotToken != "" || len(next.Layers) != 1 {
		t.Fatalf("new recipe: %+v %v", next, err)
	}
}
