package volume

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkCreateDelete times a volume's creation and deletion: a plain
// directory (--volume-quota 0) and an ext4 image of each size (the
// format per size is done once, before the timer). Root: loop devices.
func BenchmarkCreateDelete(b *testing.B) {
	quiet()
	for _, quota := range []int{0, 1024, 10240} {
		b.Run(fmt.Sprintf("quota=%dMB", quota), func(b *testing.B) {
			ctx := context.Background()
			m, _, _ := newManager(b, quota)
			m.cfg.MaxPerTeam = 0
			if quota > 0 {
				if _, err := m.diskTemplate(ctx, quota); err != nil {
					b.Fatal(err)
				}
			}
			var create, del float64
			for i := 0; i < b.N; i++ {
				t0 := nowMS()
				v, err := m.Create(ctx, "team1", fmt.Sprintf("v%d", i))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := m.HostDir(ctx, v.ID); err != nil {
					b.Fatal(err)
				}
				t1 := nowMS()
				if err := m.Delete(ctx, "team1", v.ID); err != nil {
					b.Fatal(err)
				}
				create += t1 - t0
				del += nowMS() - t1
			}
			b.ReportMetric(create/float64(b.N), "create-ms")
			b.ReportMetric(del/float64(b.N), "delete-ms")
		})
	}
}

// BenchmarkRemount times what a volume with a quota costs on its first
// use after a reboot: attaching its image and mounting it again.
func BenchmarkRemount(b *testing.B) {
	quiet()
	ctx := context.Background()
	m, _, root := newManager(b, 10240)
	v, err := m.Create(ctx, "team1", "v")
	if err != nil {
		b.Fatal(err)
	}
	fs := filepath.Join(root, v.ID, "fs")
	var total float64
	for i := 0; i < b.N; i++ {
		if err := unix.Unmount(fs, 0); err != nil {
			b.Fatal(err)
		}
		t0 := nowMS()
		if _, err := m.HostDir(ctx, v.ID); err != nil {
			b.Fatal(err)
		}
		total += nowMS() - t0
	}
	b.ReportMetric(total/float64(b.N), "mount-ms")
}

// quiet drops the store's log of its migrations, which would break the
// benchmark's output lines.
func quiet() { slog.SetDefault(slog.New(slog.DiscardHandler)) }
