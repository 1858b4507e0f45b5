package rootfs

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// BenchmarkMountOverlay times Mount (Unmount is timed separately) with no
// disk limit and with limits of several sizes.
//
//	go test -run '^$' -bench . -benchtime 200x ./internal/rootfs
func BenchmarkMountOverlay(b *testing.B) {
	s, layer := tinyStore(b)
	for _, mb := range []int{0, 64, 1024, 10240} {
		name := "nolimit"
		if mb > 0 {
			name = fmt.Sprintf("limit%dMB", mb)
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			// The first Mount of a size formats its image; later ones copy it.
			r, err := s.Mount(ctx, "warm", []string{layer}, mb)
			if err != nil {
				b.Fatal(err)
			}
			r.Unmount()
			b.Run("mount", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					r, err := s.Mount(ctx, "bench", []string{layer}, mb)
					if err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := r.Unmount(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
			b.Run("unmount", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					r, err := s.Mount(ctx, "bench", []string{layer}, mb)
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if err := r.Unmount(); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkDiskImage compares the two ways to get a fresh ext4 image:
// running mkfs.ext4, and copying a pre-formatted one (what Mount does).
func BenchmarkDiskImage(b *testing.B) {
	testenv.NeedRoot(b)
	s := openStore(b, b.TempDir())
	ctx := context.Background()
	for _, mb := range []int{64, 1024, 10240} {
		b.Run(fmt.Sprintf("mkfs/%dMB", mb), func(b *testing.B) {
			dir := b.TempDir()
			for i := 0; i < b.N; i++ {
				p := filepath.Join(dir, fmt.Sprint(i))
				if err := os.WriteFile(p, nil, 0o600); err != nil {
					b.Fatal(err)
				}
				if err := os.Truncate(p, int64(mb)<<20); err != nil {
					b.Fatal(err)
				}
				if err := mkfs(ctx, p, diskOptions); err != nil {
					b.Fatal(err)
				}
			}
		})
		tmpl, err := s.diskTemplate(ctx, mb)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("copy/%dMB", mb), func(b *testing.B) {
			dir := b.TempDir()
			for i := 0; i < b.N; i++ {
				f, err := copySparse(tmpl, filepath.Join(dir, fmt.Sprint(i)))
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
	}
}

// BenchmarkUnmountDirty times Unmount of a sandbox that has just written
// 200 MB (still dirty in the page cache): the disk is shut down rather
// than written back.
func BenchmarkUnmountDirty(b *testing.B) {
	s, layer := tinyStore(b)
	ctx := context.Background()
	buf := make([]byte, 1<<20)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		r, err := s.Mount(ctx, "dirty", []string{layer}, 1024)
		if err != nil {
			b.Fatal(err)
		}
		f, err := os.Create(filepath.Join(r.Dir(), "big"))
		if err != nil {
			b.Fatal(err)
		}
		for j := 0; j < 200; j++ {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		f.Close()
		b.StartTimer()
		if err := r.Unmount(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommit times Commit of a disk-limited sandbox that wrote
// files, what a build step's commit costs: the copy of its upper dir (its
// data and one inode per file), the syncfs, and the Unmount.
func BenchmarkCommit(b *testing.B) {
	s, layer := tinyStore(b)
	ctx := context.Background()
	for _, c := range []struct {
		name       string
		files, kib int
	}{{"1file-200MB", 1, 200 << 10}, {"2000files-50KB", 2000, 50}} {
		b.Run(c.name, func(b *testing.B) {
			buf := make([]byte, c.kib<<10)
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				r, err := s.Mount(ctx, "commit", []string{layer}, 1024)
				if err != nil {
					b.Fatal(err)
				}
				for j := 0; j < c.files; j++ {
					dir := filepath.Join(r.Dir(), "d", fmt.Sprint(j%100))
					if err := os.MkdirAll(dir, 0o755); err != nil {
						b.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(j)), buf, 0o644); err != nil {
						b.Fatal(err)
					}
				}
				id := fmt.Sprint("c", i)
				b.StartTimer()
				if err := r.Commit(s.Store, id); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := mountinfo.RemoveTree(s.LayerDir(id)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkCopyDisk times CopyDisk (what a snapshot or fork copies while
// the sandbox is frozen) of a 1 GiB disk that holds 0, 50 or 500 MB of
// files, and MountCopy (what each sandbox restored from it does). Only
// written extents are copied: the cost follows what the sandbox wrote, not
// its disk's size.
func BenchmarkCopyDisk(b *testing.B) {
	s, layer := tinyStore(b)
	ctx := context.Background()
	buf := make([]byte, 1<<20)
	for _, written := range []int{0, 50, 500} {
		b.Run(fmt.Sprintf("%dMB-written", written), func(b *testing.B) {
			id := fmt.Sprintf("cp%d", written)
			r, err := s.Mount(ctx, id, []string{layer}, 1024)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Unmount()
			f, err := os.Create(filepath.Join(r.Dir(), "data"))
			if err != nil {
				b.Fatal(err)
			}
			for range written {
				rand.Read(buf)
				if _, err := f.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
			dir := b.TempDir()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				img := filepath.Join(dir, fmt.Sprint(i))
				t0 := time.Now()
				if err := r.CopyDisk(img); err != nil {
					b.Fatal(err)
				}
				copied := time.Since(t0)
				t1 := time.Now()
				c, err := s.MountCopy(ctx, fmt.Sprintf("%s-c%d", id, i), []string{layer}, img)
				if err != nil {
					b.Fatal(err)
				}
				mounted := time.Since(t1)
				b.StopTimer()
				c.Unmount()
				os.Remove(img)
				b.ReportMetric(float64(copied.Microseconds())/1000, "copy-ms")
				b.ReportMetric(float64(mounted.Microseconds())/1000, "mountcopy-ms")
				b.StartTimer()
			}
		})
	}
}
