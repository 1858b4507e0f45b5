package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Benchmarks run real sandboxes (root). Reproduce with:
//
//	go test -run '^$' -bench . -benchtime 20x ./internal/runtime/

// BenchmarkCreateToHealthy measures Start until envd answers /health.
// Delete is not timed.
func BenchmarkCreateToHealthy(b *testing.B) {
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			rt := newTestRuntime(b, name)
			sb := newSpec(b, "")
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				sb.spec.ID = fmt.Sprintf("bc-%s-%d-%d", name, os.Getpid(), i)
				sb.net.readdIP(b) // runsc took it from the previous sandbox
				b.StartTimer()
				if err := rt.Start(ctx, sb.spec); err != nil {
					b.Fatal(err)
				}
				waitHealthy(b, sb.net.sandboxIP, 15*time.Second)
				b.StopTimer()
				if err := rt.Delete(ctx, sb.spec.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkPauseResume measures one Pause plus one Resume.
func BenchmarkPauseResume(b *testing.B) {
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			rt := newTestRuntime(b, name)
			ctx := context.Background()
			sb := newSpec(b, fmt.Sprintf("bp-%s-%d", name, os.Getpid()))
			b.Cleanup(func() { rt.Delete(context.Background(), sb.spec.ID) })
			if err := rt.Start(ctx, sb.spec); err != nil {
				b.Fatal(err)
			}
			waitHealthy(b, sb.net.sandboxIP, 15*time.Second)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := rt.Pause(ctx, sb.spec.ID); err != nil {
					b.Fatal(err)
				}
				if err := rt.Resume(ctx, sb.spec.ID); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			waitHealthy(b, sb.net.sandboxIP, 5*time.Second)
		})
	}
}

// BenchmarkCheckpointRestore (runsc) measures a snapshot of a running
// sandbox (checkpoint --leave-running) plus a restore of it into a new
// sandbox until envd answers; ckpt-ms and restore-ms split the two.
func BenchmarkCheckpointRestore(b *testing.B) {
	rt := newTestRuntime(b, "runsc")
	ctx := context.Background()
	a := newSpec(b, fmt.Sprintf("bk-%d", os.Getpid()))
	b.Cleanup(func() { rt.Delete(context.Background(), a.spec.ID) })
	if err := rt.Start(ctx, a.spec); err != nil {
		b.Fatal(err)
	}
	waitHealthy(b, a.net.sandboxIP, 15*time.Second)
	clone := newSpec(b, "")
	clone.fs = newOverlay(b, busyboxRootfs(b), a.fs.upper)
	clone.spec.RootFS = clone.fs.merged
	imgs := b.TempDir()
	var ckpt, restore time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		img := filepath.Join(imgs, fmt.Sprint(i))
		t0 := time.Now()
		if err := rt.Checkpoint(ctx, a.spec.ID, img, true); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		clone.spec.ID = fmt.Sprintf("%s-c%d", a.spec.ID, i)
		if err := rt.Restore(ctx, clone.spec, img); err != nil {
			b.Fatal(err)
		}
		waitHealthy(b, clone.net.sandboxIP, 10*time.Second)
		ckpt += t1.Sub(t0)
		restore += time.Since(t1)
		b.StopTimer()
		if err := rt.Delete(ctx, clone.spec.ID); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(img)
		clone.net.readdIP(b)
		b.StartTimer()
	}
	b.ReportMetric(float64(ckpt.Microseconds())/1000/float64(b.N), "ckpt-ms")
	b.ReportMetric(float64(restore.Microseconds())/1000/float64(b.N), "restore-ms")
}
