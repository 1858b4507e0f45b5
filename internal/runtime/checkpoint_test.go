package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunscCheckpointRestore proves that a checkpoint carries the
// sandbox's memory: envd's in-memory env vars (set through POST /init)
// come back in sandboxes restored from the image, two clones run beside
// the original and diverge, and a stop-checkpoint restores into the
// original ID.
func TestRunscCheckpointRestore(t *testing.T) {
	rt := newTestRuntime(t, "runsc")
	ctx := context.Background()
	a := newSpec(t, fmt.Sprintf("ck-%d", os.Getpid()))
	t.Cleanup(func() { rt.Delete(context.Background(), a.spec.ID) })
	if err := rt.Start(ctx, a.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	waitHealthy(t, a.net.sandboxIP, 15*time.Second)
	setEnv(t, a.net.sandboxIP, "CKPT", "before")
	if out, err := sandboxExec(rt, a.spec.ID, "sh", "-c", "echo on-disk > /root/state"); err != nil {
		t.Fatalf("write file: %v %s", err, out)
	}

	img := filepath.Join(t.TempDir(), "img")
	start := time.Now()
	if err := rt.Checkpoint(ctx, a.spec.ID, img, true); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	t.Logf("checkpoint --leave-running: %v", time.Since(start).Round(time.Millisecond))
	waitHealthy(t, a.net.sandboxIP, 5*time.Second)

	// Two clones, each with its own netns (another address) and a copy
	// of the original's upper dir, like the image code will make them.
	var clones []testSandbox
	for i := 1; i <= 2; i++ {
		c := newSpec(t, fmt.Sprintf("%s-clone%d", a.spec.ID, i))
		c.fs = newOverlay(t, busyboxRootfs(t), a.fs.upper)
		c.spec.RootFS = c.fs.merged
		t.Cleanup(func() { rt.Delete(context.Background(), c.spec.ID) })
		start := time.Now()
		if err := rt.Restore(ctx, c.spec, img); err != nil {
			t.Fatalf("Restore %s: %v", c.spec.ID, err)
		}
		restored := time.Since(start)
		ready := waitHealthy(t, c.net.sandboxIP, 10*time.Second)
		t.Logf("restore into %s: %v, envd healthy %v later", c.spec.ID, restored.Round(time.Millisecond), ready.Round(time.Millisecond))
		if got := getEnv(t, c.net.sandboxIP, "CKPT"); got != "before" {
			t.Errorf("%s: CKPT = %q after restore, want %q (memory state lost)", c.spec.ID, got, "before")
		}
		if out, err := sandboxExec(rt, c.spec.ID, "cat", "/root/state"); err != nil || out != "on-disk\n" {
			t.Errorf("%s: file from the copied upper dir: %q %v", c.spec.ID, out, err)
		}
		clones = append(clones, c)
	}
	// They diverge: each keeps its own memory.
	setEnv(t, clones[0].net.sandboxIP, "CKPT", "clone1")
	if got := getEnv(t, a.net.sandboxIP, "CKPT"); got != "before" {
		t.Errorf("original sees the clone's change: %q", got)
	}
	if got := getEnv(t, clones[1].net.sandboxIP, "CKPT"); got != "before" {
		t.Errorf("clone2 sees clone1's change: %q", got)
	}

	// Checkpoint without leave-running stops the sandbox; restoring under
	// the same ID needs the netns address back (runsc took it).
	setEnv(t, a.net.sandboxIP, "CKPT", "second")
	img2 := filepath.Join(t.TempDir(), "img2")
	if err := rt.Checkpoint(ctx, a.spec.ID, img2, false); err != nil {
		t.Fatalf("Checkpoint (stop): %v", err)
	}
	if st, err := rt.State(ctx, a.spec.ID); err != nil || st != StateStopped {
		t.Errorf("State after stop-checkpoint: %s %v, want stopped", st, err)
	}
	if err := rt.Delete(ctx, a.spec.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	assertGone(t, rt, a.spec.ID, 0)
	// The clones' IDs start with the original's: runsc would resolve the
	// deleted ID as a prefix of theirs if we let it.
	if _, err := rt.State(ctx, a.spec.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("State of deleted prefix ID: %v, want ErrNotFound", err)
	}
	for _, c := range clones {
		if st, err := rt.State(ctx, c.spec.ID); err != nil || st != StateRunning {
			t.Errorf("%s after deleting the original: %s %v", c.spec.ID, st, err)
		}
	}
	a.net.readdIP(t)
	if err := rt.Restore(ctx, a.spec, img2); err != nil {
		t.Fatalf("Restore into the original ID: %v", err)
	}
	waitHealthy(t, a.net.sandboxIP, 10*time.Second)
	if got := getEnv(t, a.net.sandboxIP, "CKPT"); got != "second" {
		t.Errorf("CKPT = %q after stop/restore, want %q", got, "second")
	}

	for _, c := range append(clones, a) {
		if err := rt.Delete(ctx, c.spec.ID); err != nil {
			t.Errorf("Delete %s: %v", c.spec.ID, err)
		}
		assertGone(t, rt, c.spec.ID, 0)
	}
}

// TestRuncCheckpointUnsupported: without CRIU >= 4.2 (Debian 12 has
// 3.17), runc says so on every checkpoint and restore call.
func TestRuncCheckpointUnsupported(t *testing.T) {
	rt := newTestRuntime(t, "runc")
	if rt.Capabilities().Checkpoint {
		t.Skipf("this host has a usable CRIU: %s", rt.Capabilities().CheckpointDetail)
	}
	t.Logf("capabilities: %+v", rt.Capabilities())
	const want = "checkpoint/restore is not supported by the runc runtime on this host: CRIU >= 4.2 is required"
	ctx := context.Background()
	errs := []error{
		rt.Checkpoint(ctx, "any", t.TempDir(), true),
		rt.Checkpoint(ctx, "any", t.TempDir(), false),
		rt.Restore(ctx, Spec{ID: "any"}, t.TempDir()),
	}
	for _, err := range errs {
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrNotSupported) {
			t.Errorf("got %v, want an ErrNotSupported saying %q", err, want)
		}
	}
}

// setEnv sets an env var in envd's memory with POST /init.
func setEnv(t testing.TB, ip, k, v string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"envVars": map[string]string{k: v}})
	req, _ := http.NewRequest("POST", envdURL(ip)+"/init", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", "secret-token")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("POST /init: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /init: %s %s", resp.Status, b)
	}
}

// getEnv reads an env var from envd's GET /envs.
func getEnv(t testing.TB, ip, k string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", envdURL(ip)+"/envs", nil)
	req.Header.Set("X-Access-Token", "secret-token")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := httpClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("GET /envs: %v", err)
	}
	defer resp.Body.Close()
	var envs map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&envs); err != nil {
		t.Fatalf("GET /envs: %s: %v", resp.Status, err)
	}
	return envs[k]
}
