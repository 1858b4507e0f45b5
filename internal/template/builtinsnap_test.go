package template

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/baseimage"
	"github.com/warren-sandbox/warren/internal/codeinterp"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/setup"
)

// installCodeInterpreter puts the installed code-interpreter-v1 (`warren
// setup` built it) into e's data dir, without a start snapshot.
func installCodeInterpreter(t *testing.T, e *env) *image.Template {
	t.Helper()
	installed, err := image.Open(setup.DefaultDataDir)
	if err != nil {
		t.Fatal(err)
	}
	ci, err := installed.Template(baseimage.CodeInterpreterID)
	if err != nil {
		t.Skipf("code-interpreter-v1 is not installed (%v): `warren setup` builds it", err)
	}
	ci.Layers = image.BuiltLayers(ci)
	ci.Snapshot, ci.SnapshotToken = "", ""
	for _, l := range ci.Layers {
		if !e.images.HasLayer(l) {
			if err := os.Symlink(installed.LayerDir(l), e.images.LayerDir(l)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := e.images.PutTemplate(ci); err != nil {
		t.Fatal(err)
	}
	return ci
}

// The code interpreter's start snapshot holds a running default kernel:
// a sandbox restored from it answers a cell at once; the snapshot is
// recorded on the built-in template over its layers, and found cached.
func TestCodeInterpreterStartSnapshot(t *testing.T) {
	e := newEnvWith(t, newStore(t), "runsc")
	built := installCodeInterpreter(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := e.b.SnapshotBuiltin(ctx, baseimage.CodeInterpreterID); err != nil {
		t.Fatal(err)
	}
	img, err := e.images.Template(baseimage.CodeInterpreterID)
	if err != nil {
		t.Fatal(err)
	}
	if img.Snapshot == "" || len(img.SnapshotToken) < 32 || !e.images.HasSnapshot(img.Snapshot) ||
		!slices.Equal(img.Layers, append(slices.Clone(built.Layers), img.Snapshot)) || img.Recipe != built.Recipe {
		t.Fatalf("template after the snapshot: %+v (built: %v)", img, built.Layers)
	}
	e.assertNothingLeft()

	dirs, err := e.images.LayerDirs(img)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := e.b.cfg.Node.Restore(ctx, node.CreateRequest{ID: sandbox.NewID(), Layers: dirs, CPUCount: 2, MemoryMB: baseimage.CodeInterpreterMemoryMB,
		AccessToken: img.SnapshotToken, User: img.User, Workdir: img.Workdir}, e.images.SnapshotDir(img.Snapshot))
	if err != nil {
		t.Fatal(err)
	}
	defer e.b.remove(inst)
	// The kernel answers at once: no start of Python (seconds) first.
	url := "http://" + net.JoinHostPort(inst.Slot.SandboxIP.String(), strconv.Itoa(codeinterp.Port)) + "/execute"
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(`{"code":"6 * 7"}`))
	req.Header.Set("X-Access-Token", img.SnapshotToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var result, ended bool
	for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		var ev struct{ Type, Text string }
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		result = result || ev.Type == "result" && ev.Text == "42"
		ended = ended || ev.Type == "end_of_execution"
	}
	if res.StatusCode != http.StatusOK || !result || !ended {
		t.Fatalf("the restored kernel: %d %s", res.StatusCode, body)
	}

	// Recorded: a second call does nothing; a server on another data dir
	// with the same layers and runtime finds the snapshot by its ID.
	if err := e.b.SnapshotBuiltin(ctx, baseimage.CodeInterpreterID); err != nil {
		t.Fatal(err)
	}
	if again, _ := e.images.Template(baseimage.CodeInterpreterID); again.Snapshot != img.Snapshot || again.SnapshotToken != img.SnapshotToken {
		t.Errorf("after a second call: %+v", again)
	}
	if err := e.images.PutTemplate(built); err != nil {
		t.Fatal(err)
	}
	if err := e.b.SnapshotBuiltin(ctx, baseimage.CodeInterpreterID); err != nil {
		t.Fatal(err)
	}
	if again, _ := e.images.Template(baseimage.CodeInterpreterID); again.Snapshot != img.Snapshot || again.SnapshotToken != img.SnapshotToken {
		t.Errorf("the cached snapshot was not reused: %+v", again)
	}
}

// A runtime without checkpoints keeps booting the template: nothing is
// recorded, and that is no error.
func TestCodeInterpreterNoSnapshotWithoutCheckpoints(t *testing.T) {
	e := newEnv(t, newStore(t))
	if e.b.cfg.Node.Runtime().Capabilities().Checkpoint {
		t.Skip("runc can checkpoint here")
	}
	installCodeInterpreter(t, e)
	if err := e.b.SnapshotBuiltin(context.Background(), baseimage.CodeInterpreterID); err != nil {
		t.Fatal(err)
	}
	if img, _ := e.images.Template(baseimage.CodeInterpreterID); img.Snapshot != "" {
		t.Errorf("a snapshot was recorded: %+v", img)
	}
}
