package security

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nodeMemoryMB is the host's memory, as the node counts it.
func nodeMemoryMB(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb >> 10
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

func TestTemplateAsksMoreThanTheNode(t *testing.T) {
	afterCase(t)
	for i, body := range []map[string]any{
		{"memoryMB": 256 << 10},
		{"memoryMB": nodeMemoryMB(t) + 1024},
		{"cpuCount": 4096},
	} {
		rb, r := newRawBuild(t, S.teamA, fmt.Sprintf("sec-huge-%d", i), body)
		if rb != nil || r.Status != http.StatusBadRequest {
			t.Errorf("a template asking %v: %s, want 400", body, r)
		}
		checkErrorBody(t, r)
	}
}

// Sandboxes' memory may add up to the node's memory times the overcommit
// (2 by default); past that, a create is refused with 503.
func TestNodeMemoryAdmission(t *testing.T) {
	afterCase(t)
	mem := nodeMemoryMB(t) * 2 * 2 / 5 // two fit, the third does not
	rb, r := newRawBuild(t, S.teamA, "sec-big-memory", map[string]any{"memoryMB": mem})
	if rb == nil {
		t.Fatalf("a template of %d MiB (less than the node's memory): %s", mem, r)
	}
	if r := rb.start(t, "base", []step{}); r.Status != http.StatusAccepted {
		t.Fatalf("starting the build: %s", r)
	}
	if b := rb.wait(t); b.Err != nil {
		t.Fatalf("the build failed: %v", b.Err)
	}
	var statuses []int
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sb, err := S.createSandbox(ctx, S.teamA, createOpts{Template: rb.TemplateID})
		cancel()
		if err == nil {
			t.Cleanup(func() { killSandbox(t, sb) })
			statuses = append(statuses, http.StatusCreated)
			continue
		}
		se, ok := err.(*statusError)
		if !ok {
			t.Fatal(err)
		}
		checkErrorBody(t, se.r)
		statuses = append(statuses, se.r.Status)
	}
	if statuses[0] != http.StatusCreated || statuses[2] != http.StatusServiceUnavailable {
		t.Errorf("three sandboxes of %d MiB each on a node of %d MiB (overcommit 2): %v, want the first created and the third 503",
			mem, nodeMemoryMB(t), statuses)
	}
}

// fill takes the data dir's free space down to leaveMB with a file of the
// suite's own, removed at the end of the test.
func fill(t *testing.T, leaveMB int64) {
	t.Helper()
	p := filepath.Join(S.srv.dataDir, "sec-filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	defer f.Close()
	if n := S.srv.freeMB() - leaveMB; n > 0 {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, n<<20); err != nil {
			t.Fatalf("filling the data dir: %v", err)
		}
	}
}

// Below the disk reserve (2048 MiB by default) creates, builds and uploads
// are refused with 507 instead of filling the disk that also holds the
// database.
func TestDiskReserve(t *testing.T) {
	afterCase(t)
	rb, r := newRawBuild(t, S.teamA, "sec-disk-reserve", nil)
	if rb == nil {
		t.Fatalf("POST /v3/templates: %s", r)
	}
	fill(t, 1024)
	t.Logf("the data dir's file system has %d MiB free", S.srv.freeMB())
	want507 := func(what string, r apiResponse) {
		t.Helper()
		checkErrorBody(t, r)
		if r.Status != http.StatusInsufficientStorage {
			t.Errorf("%s below the disk reserve: %s, want 507", what, r)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := S.createSandbox(ctx, S.teamA, createOpts{})
	if err == nil {
		t.Cleanup(func() { killSandbox(t, sb) })
		t.Errorf("sandbox create below the disk reserve: created %s, want 507", sb.ID)
	} else if se, ok := err.(*statusError); ok {
		want507("sandbox create", se.r)
	} else {
		t.Fatal(err)
	}
	payload := []entry{file("a.txt", "a\n")}
	hash := sdkFilesHash("a.txt", "/a.txt", payload)
	want507("template file upload", rb.upload(t, hash, tarOf(t, payload)))
	want507("template build start", rb.start(t, "base", []step{{Type: "RUN", Args: []string{"true", "root"}}}))
}

// Each team has its rate; one team's flood answers it 429 and leaves
// others alone.
func TestAPIRateLimit(t *testing.T) {
	afterCase(t)
	const requests, workers = 600, 16
	var limited, other atomic.Int64
	var firstLimited atomic.Value
	var wg sync.WaitGroup
	jobs := make(chan int, requests)
	for i := 0; i < requests; i++ {
		jobs <- i
	}
	close(jobs)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				r, err := S.srv.call(context.Background(), S.teamC, "GET", "/sandboxes", nil)
				if err != nil {
					continue
				}
				if r.Status == http.StatusTooManyRequests {
					limited.Add(1)
					firstLimited.CompareAndSwap(nil, r)
				} else if r.Status != http.StatusOK {
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	t.Logf("%d requests in %s: %d answered 429", requests, took.Round(time.Millisecond), limited.Load())
	if limited.Load() == 0 {
		t.Errorf("%d requests of one team in %s: none was rate-limited (429)", requests, took.Round(time.Millisecond))
	} else {
		checkErrorBody(t, firstLimited.Load().(apiResponse))
	}
	// Another team is not limited by team C's flood.
	if r, err := S.srv.call(context.Background(), S.teamA, "GET", "/sandboxes", nil); err != nil || r.Status != http.StatusOK {
		t.Errorf("another team's request during the flood: %v %v", err, r)
	}
}

func TestUploadLargerThanTheLimit(t *testing.T) {
	requireFlag(t, "max-upload-mb", "unbounded template uploads")
	afterCase(t)
	rb, r := newRawBuild(t, S.teamA, "sec-big-upload", nil)
	if rb == nil {
		t.Fatalf("POST /v3/templates: %s", r)
	}
	big := []entry{{Name: "big.bin", Type: '0', Mode: 0o644, Body: bytes.Repeat([]byte{0x5a}, (maxUploadMB+8)<<20)}}
	hash := sdkFilesHash("big.bin", "/big.bin", big)
	r = rb.upload(t, hash, tarOf(t, big))
	if r.Status < 400 || r.Status >= 500 {
		t.Errorf("an upload of %d MiB with --max-upload-mb %d: %s, want a 4xx", maxUploadMB+8, maxUploadMB, r)
	}
	checkErrorBody(t, r)
	if present, _ := rb.uploadURL(t, hash); present {
		t.Errorf("the too-large upload was kept")
	}
}

// The data dir holds every tenant's layers: no local user may enter it.
func TestDataDirIsPrivate(t *testing.T) {
	fi, err := os.Stat(S.srv.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	// The suite's data dir was 0755 when the server started.
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("the data dir is %v after warren serve started, want 0700", fi.Mode().Perm())
	}
}

// An upload URL is valid for its whole life, across a restart of the
// server.
func TestUploadURLSurvivesRestart(t *testing.T) {
	afterCase(t)
	rb, r := newRawBuild(t, S.teamA, "sec-upload-restart", nil)
	if rb == nil {
		t.Fatalf("POST /v3/templates: %s", r)
	}
	payload := []entry{file("a.txt", "a\n")}
	hash := sdkFilesHash("a.txt", "/a.txt", payload)
	_, u := rb.uploadURL(t, hash)
	if err := S.srv.stop(); err != nil {
		t.Fatal(err)
	}
	if err := S.srv.run(S); err != nil {
		t.Fatalf("restarting the server: %v", err)
	}
	req, _ := http.NewRequest("PUT", u, bytes.NewReader(tarOf(t, payload)))
	up, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	if up.Status != http.StatusCreated {
		t.Errorf("an upload URL from before the restart: %s, want 201", up)
	}
}

// A sandbox writing to envd's output (its log, kept on the host) meets a
// cap: the host's memory-backed run dir does not take it, and on the data
// dir it counts against the sandbox's own disk.
func TestEnvdLogFlood(t *testing.T) {
	afterCase(t)
	sb := mustCreate(t, S.teamA, createOpts{})
	runBefore, dataBefore := treeMB(S.srv.runDir), S.srv.freeMB()
	const writeMB = 1300 // past the sandbox's 1 GiB disk
	r := sb.run(t, "root", fmt.Sprintf(`dd if=/dev/zero of=/proc/1/fd/1 bs=1M count=%d 2>&1 | tail -1`, writeMB))
	t.Logf("writing %d MiB to envd's output: %s", writeMB, r)
	runGrew, dataTook := treeMB(S.srv.runDir)-runBefore, dataBefore-S.srv.freeMB()
	t.Logf("the run dir grew by %d MiB, the data dir's file system by %d MiB", runGrew, dataTook)
	if runGrew > 64 {
		t.Errorf("envd's output took %d MiB of the run dir (a tmpfs: memory): no cap", runGrew)
	}
	if dataTook > 1024+256 {
		t.Errorf("envd's output took %d MiB of the data dir's file system, more than the sandbox's 1 GiB disk", dataTook)
	}
}

// treeMB is the space the files below dir take (their blocks), on dir's
// own file system.
func treeMB(dir string) int64 {
	var root unix.Stat_t
	if unix.Stat(dir, &root) != nil {
		return 0
	}
	var blocks int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && fi.IsDir() && st.Dev != root.Dev {
			return filepath.SkipDir // another file system mounted below
		}
		if ok && fi.Mode().IsRegular() {
			blocks += st.Blocks
		}
		return nil
	})
	return blocks * 512 >> 20
}
