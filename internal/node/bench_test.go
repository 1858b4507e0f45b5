package node

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/runtime"
	"github.com/warren-sandbox/warren/internal/setup"
)

// The node benchmarks report medians and 99th percentiles as custom
// metrics (ms), since a mean hides the tail that users feel.

func reportPercentiles(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	p := func(q float64) float64 {
		i := int(q*float64(len(ds))+0.5) - 1
		if i < 0 {
			i = 0
		}
		if i >= len(ds) {
			i = len(ds) - 1
		}
		return float64(ds[i].Microseconds()) / 1000
	}
	b.ReportMetric(p(0.50), name+"-p50-ms")
	b.ReportMetric(p(0.99), name+"-p99-ms")
}

// benchNodes caches one node per runtime and pool size: the testing
// package calls a benchmark function several times (growing b.N), and
// managers with one prefix must not overlap. TestMain destroys them.
var benchNodes = map[string]*Node{}

// benchNode is testNode with a chosen slot pool size.
func benchNode(b *testing.B, rtName string, pool int) *Node {
	setupFixture(b)
	key := fmt.Sprintf("%s/%d", rtName, pool)
	if n, ok := benchNodes[key]; ok {
		return n
	}
	prefix := fmt.Sprintf("wnb%d", len(benchNodes))
	cfg := runtime.Config{StateDir: filepath.Join("/run/warren-node-bench", rtName), CgroupParent: "/warren-node-bench"}
	if rtName == "runsc" {
		cfg.Binary = setup.RunscPath(setup.DefaultDataDir)
		// runsc's options under measurement (scripts/runsc-options.sh).
		cfg.RunscFlags = strings.Fields(os.Getenv("WARREN_BENCH_RUNSC_FLAGS"))
	}
	rt, err := runtime.New(rtName, cfg)
	if err != nil {
		b.Fatal(err)
	}
	cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 125, byte(len(benchNodes) * 16), 0}), 20)
	nw, err := network.New(network.Config{CIDR: cidr, Prefix: prefix, PoolSize: pool})
	if err != nil {
		b.Fatal(err)
	}
	n, err := New(Config{Runtime: rt, Network: nw, Rootfs: LocalRootfs(fixture.roots, fixture.store), EnvdPath: fixture.envd, ResolvConf: "/etc/resolv.conf"})
	if err != nil {
		nw.Destroy()
		b.Fatal(err)
	}
	benchNodes[key] = n
	return n
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, n := range benchNodes {
		n.cfg.Network.Destroy()
	}
	os.Exit(code)
}

// BenchmarkCreateToHealthy measures Create (slot, rootfs, runtime start)
// until envd answers /health, with a cold slot and with one from the pool.
func BenchmarkCreateToHealthy(b *testing.B) {
	for _, rtName := range []string{"runc", "runsc"} {
		for _, pool := range []int{-1, 4} {
			name := rtName + "/cold-slot"
			if pool > 0 {
				name = rtName + "/pooled-slot"
			}
			b.Run(name, func(b *testing.B) {
				n := benchNode(b, rtName, pool)
				ctx := context.Background()
				var ds []time.Duration
				var charged uint64
				for i := 0; i < b.N; i++ {
					if pool > 0 {
						waitPool(n)
					}
					req := baseRequest(b, fmt.Sprintf("bench-%s-%d", rtName, i))
					start := time.Now()
					inst, err := n.Create(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					ds = append(ds, time.Since(start))
					if i == 0 {
						time.Sleep(500 * time.Millisecond) // let it settle, then read what an idle sandbox costs
						if st, err := n.Stats(ctx, inst); err == nil {
							charged = st.MemoryBytes
						}
					}
					if err := n.Delete(ctx, inst); err != nil {
						b.Fatal(err)
					}
				}
				reportPercentiles(b, "create", ds)
				b.ReportMetric(float64(charged)/(1<<20), "idle-MiB")
			})
		}
	}
}

func waitPool(n *Node) {
	// The pool refills in the background after each Acquire.
	time.Sleep(30 * time.Millisecond)
}

// BenchmarkPauseResume measures Pause and Resume of an idle sandbox.
func BenchmarkPauseResume(b *testing.B) {
	for _, rtName := range []string{"runc", "runsc"} {
		b.Run(rtName, func(b *testing.B) {
			n := benchNode(b, rtName, 2)
			ctx := context.Background()
			inst, err := n.Create(ctx, baseRequest(b, "bench-pause-"+rtName))
			if err != nil {
				b.Fatal(err)
			}
			defer n.Delete(ctx, inst)
			var pauses, resumes []time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := n.Freeze(ctx, inst); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := n.Thaw(ctx, inst); err != nil {
					b.Fatal(err)
				}
				pauses = append(pauses, t1.Sub(t0))
				resumes = append(resumes, time.Since(t1))
			}
			reportPercentiles(b, "pause", pauses)
			reportPercentiles(b, "resume", resumes)
		})
	}
}

// BenchmarkCheckpointRestore checkpoints (leaving it running) a sandbox,
// freshly booted or with a process holding 50 MiB, and restores the image
// into a new sandbox until its envd is healthy. The booted one answers
// whether restoring a booted base would create faster than booting it
// (BenchmarkCreateSteps).
func BenchmarkCheckpointRestore(b *testing.B) {
	for _, mib := range []int{0, 50} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			n := benchNode(b, "runsc", 2)
			ctx := context.Background()
			req := baseRequest(b, fmt.Sprintf("bench-ckpt-%d", mib))
			req.MemoryMB = 512
			inst, err := n.Create(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			defer n.Delete(ctx, inst)
			if mib > 0 {
				ballast(b, inst, mib)
			}
			var ckpts, restores []time.Duration
			var imageBytes int64
			for i := 0; i < b.N; i++ {
				dir := b.TempDir()
				t0 := time.Now()
				if err := n.Checkpoint(ctx, inst, dir, true); err != nil {
					b.Fatal(err)
				}
				ckpts = append(ckpts, time.Since(t0))
				imageBytes = dirSize(dir)
				clone := req
				clone.ID = fmt.Sprintf("bench-clone-%d-%d", mib, i)
				waitPool(n)
				t1 := time.Now()
				c, err := n.Restore(ctx, clone, dir)
				if err != nil {
					b.Fatal(err)
				}
				restores = append(restores, time.Since(t1))
				n.Delete(ctx, c)
				os.RemoveAll(dir)
			}
			reportPercentiles(b, "checkpoint", ckpts)
			reportPercentiles(b, "restore", restores)
			b.ReportMetric(float64(imageBytes)/(1<<20), "image-MiB")
		})
	}
}

func dirSize(dir string) int64 {
	var total int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			total += fi.Size()
		}
		return nil
	})
	return total
}

// ballast starts a process in inst that holds mib MiB of random bytes
// (resident: written, not just allocated).
func ballast(b *testing.B, inst *Instance, mib int) {
	out, code := sh(b, inst, "tok-"+inst.ID, "", fmt.Sprintf(`nohup python3 -c '
import time
n = %d << 20
ballast = bytearray(n)
ballast[::4096] = b"\x01" * ((n + 4095) // 4096)  # every page written: resident
open("/tmp/ballast-ready", "w").close()
time.sleep(86400)' >/dev/null 2>&1 &
for i in $(seq 300); do [ -e /tmp/ballast-ready ] && break; sleep 0.1; done; echo ok`, mib), 60*time.Second)
	if code != 0 {
		b.Fatalf("ballast: %q", out)
	}
}

// BenchmarkPauseToDisk pauses a sandbox holding 50 or 500 MiB to disk
// (checkpoint with memory, container and slot released) and resumes it
// (remount, fresh slot, restore, envd healthy), and reports the memory
// its cgroup was charged before the pause (all of which the pause frees:
// the cgroup is removed with the container).
func BenchmarkPauseToDisk(b *testing.B) {
	for _, mib := range []int{50, 500} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			n := benchNode(b, "runsc", 2)
			ctx := context.Background()
			req := baseRequest(b, fmt.Sprintf("bench-ptd-%d", mib))
			req.MemoryMB = 1024
			inst, err := n.Create(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { n.Delete(ctx, inst) }()
			ballast(b, inst, mib)
			var pauses, resumes []time.Duration
			var freed int64
			for i := 0; i < b.N; i++ {
				charged := cgroupMemoryBench(inst.ID)
				t0 := time.Now()
				p, err := n.PauseToDisk(ctx, inst, true)
				if err != nil {
					b.Fatal(err)
				}
				pauses = append(pauses, time.Since(t0))
				if cgroupMemoryBench(inst.ID) == -1 {
					freed = charged
				}
				waitPool(n)
				t1 := time.Now()
				inst, err = n.ResumeFromDisk(ctx, req, p, true, func(*Instance) error { return nil })
				if err != nil {
					b.Fatal(err)
				}
				resumes = append(resumes, time.Since(t1))
				n.DropCheckpoint(p)
			}
			reportPercentiles(b, "pause", pauses)
			reportPercentiles(b, "resume", resumes)
			b.ReportMetric(float64(freed)/(1<<20), "freed-MiB")
		})
	}
}

func cgroupMemoryBench(id string) int64 {
	bs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/warren-node-bench", id, "memory.usage_in_bytes"))
	if err != nil {
		return -1
	}
	var v int64
	fmt.Sscan(string(bs), &v)
	return v
}

// BenchmarkSnapshotFork snapshots a sandbox holding 50 MiB (it runs on)
// and restores 1 or 10 sandboxes from the snapshot, concurrently, until
// all of them are healthy.
func BenchmarkSnapshotFork(b *testing.B) {
	n := benchNode(b, "runsc", 4)
	ctx := context.Background()
	req := baseRequest(b, "bench-fork-src")
	req.MemoryMB = 512
	src, err := n.Create(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Delete(ctx, src)
	ballast(b, src, 50)
	for _, count := range []int{1, 10} {
		b.Run(fmt.Sprintf("children-%d", count), func(b *testing.B) {
			var snaps, forks []time.Duration
			for i := 0; i < b.N; i++ {
				dir := filepath.Join(b.TempDir(), "snap")
				t0 := time.Now()
				if err := n.Snapshot(ctx, src, dir); err != nil {
					b.Fatal(err)
				}
				snaps = append(snaps, time.Since(t0))
				t1 := time.Now()
				children := make([]*Instance, count)
				errs := make(chan error, count)
				for c := range count {
					go func() {
						r := req
						r.ID = fmt.Sprintf("bench-fork-%d-%d", i, c)
						r.DiskImage = filepath.Join(dir, SnapshotDiskName)
						inst, err := n.Restore(ctx, r, dir)
						children[c] = inst
						errs <- err
					}()
				}
				for range count {
					if err := <-errs; err != nil {
						b.Fatal(err)
					}
				}
				forks = append(forks, time.Since(t1))
				for _, c := range children {
					n.Delete(ctx, c)
				}
				os.RemoveAll(dir)
			}
			reportPercentiles(b, "snapshot", snaps)
			reportPercentiles(b, "fork", forks)
		})
	}
}
