package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/steptrace"
	fspb "github.com/warren-sandbox/warren/proto/envd/filesystem"
	"github.com/warren-sandbox/warren/proto/envd/filesystem/filesystemconnect"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// createSteps are the steps Create marks on its context's trace, in order.
var createSteps = []string{"slot", "rootfs-mount", "root-files", "runtime-bundle", "runtime-start", "envd-health"}

func stepNames(tr *steptrace.Trace) []string {
	var names []string
	for _, s := range tr.Steps() {
		names = append(names, s.Name)
	}
	return names
}

// TestCreateMarksItsSteps: the benchmarks' breakdown of a create comes
// from the marks the real code path makes, so every step must be there.
func TestCreateMarksItsSteps(t *testing.T) {
	for _, rtName := range []string{"runsc", "runc"} {
		t.Run(rtName, func(t *testing.T) {
			n := testNode(t, rtName)
			tr := steptrace.New()
			ctx, cancel := context.WithTimeout(steptrace.With(context.Background(), tr), time.Minute)
			defer cancel()
			inst, err := n.Create(ctx, baseRequest(t, "steps-"+rtName))
			if err != nil {
				t.Fatal(err)
			}
			defer n.Delete(context.Background(), inst)
			if got := stepNames(tr); !slices.Equal(got, createSteps) {
				t.Errorf("steps = %v, want %v", got, createSteps)
			}
		})
	}
}

// BenchmarkCreateSteps breaks Create (runsc, a slot from the pool) into
// the steps it marks, with the median and 99th percentile of each.
func BenchmarkCreateSteps(b *testing.B) {
	n := benchNode(b, "runsc", 4)
	ctx := context.Background()
	per := map[string][]time.Duration{}
	var total []time.Duration
	for i := 0; i < b.N; i++ {
		waitPool(n)
		tr := steptrace.New()
		start := time.Now()
		inst, err := n.Create(steptrace.With(ctx, tr), baseRequest(b, fmt.Sprintf("bench-steps-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		total = append(total, time.Since(start))
		for _, s := range tr.Steps() {
			per[s.Name] = append(per[s.Name], s.D)
		}
		if err := n.Delete(ctx, inst); err != nil {
			b.Fatal(err)
		}
	}
	for _, name := range createSteps {
		reportPercentiles(b, name, per[name])
	}
	reportPercentiles(b, "total", total)
}

// BenchmarkCommandSteps breaks a command in a running runsc sandbox into
// what envd's RPC costs without a process (a Stat of /), the start of a
// process (request to envd's start event: fork and exec inside gVisor),
// its run to the end event, the whole of what the SDK's
// commands.run('true') asks for (bash -l -c true as the default user),
// and a run of 10,000 system calls (dd of single bytes).
// Straight to envd on the slot's address: the proxy hop is measured by
// the SDK benchmark (test/e2e/bench/steps.mjs).
func BenchmarkCommandSteps(b *testing.B) {
	n := benchNode(b, "runsc", 4)
	ctx := context.Background()
	inst, err := n.Create(ctx, baseRequest(b, "bench-cmd-steps"))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Delete(ctx, inst)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	procs := processconnect.NewProcessClient(hc, inst.EnvdURL())
	files := filesystemconnect.NewFilesystemClient(hc, inst.EnvdURL())
	auth := func(h http.Header) {
		h.Set("X-Access-Token", "tok-"+inst.ID)
		h.Set("Authorization", "Basic "+basic("user"))
	}
	stat := func() {
		req := connect.NewRequest(&fspb.StatRequest{Path: "/"})
		auth(req.Header())
		if _, err := files.Stat(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	// run returns the time to the start event and to the end event.
	run := func(cmd string, args ...string) (started, ended time.Duration) {
		req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: cmd, Args: args}})
		auth(req.Header())
		t0 := time.Now()
		stream, err := procs.Start(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		defer stream.Close()
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			if ev.GetStart() != nil {
				started = time.Since(t0)
			}
			if end := ev.GetEnd(); end != nil {
				if end.GetExitCode() != 0 {
					b.Fatalf("%s exited with %d", cmd, end.GetExitCode())
				}
				return started, time.Since(t0)
			}
		}
		b.Fatalf("%s: no end event: %v", cmd, stream.Err())
		return
	}
	stat()
	run("/bin/bash", "-l", "-c", "true") // what the pool's warm-up does
	var stats, trueStart, trueEnd, bashStart, bashEnd, syscalls []time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		stat()
		stats = append(stats, time.Since(t0))
		s, e := run("/bin/true")
		trueStart, trueEnd = append(trueStart, s), append(trueEnd, e)
		s, e = run("/bin/bash", "-l", "-c", "true")
		bashStart, bashEnd = append(bashStart, s), append(bashEnd, e)
		// 10,000 system calls (a read and a write per byte): what the
		// platform's syscall path costs, which runsc's options change.
		_, e = run("/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=5000", "status=none")
		syscalls = append(syscalls, e)
	}
	reportPercentiles(b, "rpc-stat", stats)
	reportPercentiles(b, "true-start-event", trueStart)
	reportPercentiles(b, "true-end-event", trueEnd)
	reportPercentiles(b, "bash-l-start-event", bashStart)
	reportPercentiles(b, "bash-l-end-event", bashEnd)
	reportPercentiles(b, "dd-10k-syscalls-end-event", syscalls)
	// Inside envd, for the bash -l starts (what commands.run asks): its
	// "process started" log lines time each step of a start.
	steps, err := envdStartSteps(inst.LogPath, "/bin/bash")
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"user_lookup", "prepare", "stdio", "exec"} {
		reportPercentiles(b, "envd-"+strings.ReplaceAll(name, "_", "-"), steps[name])
	}
}

// envdStartSteps reads envd's log at path for the "process started" lines
// of cmd and returns the durations of each step they give (NAME_us).
func envdStartSteps(path, cmd string) (map[string][]time.Duration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string][]time.Duration{}
	for _, line := range strings.Split(string(data), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != "process started" || rec["cmd"] != cmd {
			continue
		}
		for k, v := range rec {
			if name, ok := strings.CutSuffix(k, "_us"); ok {
				if us, ok := v.(float64); ok {
					out[name] = append(out[name], time.Duration(us)*time.Microsecond)
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no timed \"process started\" line of %s in %s", cmd, path)
	}
	return out, nil
}
