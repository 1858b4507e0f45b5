package imageblob

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/blobstore/s3test"
	"github.com/warren-sandbox/warren/internal/image"
)

// BenchmarkS3UploadFetch: an image of one 64 MiB layer (random bytes,
// and a 1 GiB sparse file of two data runs) stored in the test S3 server
// (SeaweedFS on loopback) and fetched by another node, each round a new
// layer; it reports the medians and p99s of both, in ms.
func BenchmarkS3UploadFetch(b *testing.B) {
	ctx := context.Background()
	srv := s3test.Start(b)
	blobs, err := blobstore.NewS3(ctx, srv.Config("bench"))
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 64<<20)
	rand.Read(data)
	var ups, downs []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		a, c := benchNode(b, blobs), benchNode(b, blobs)
		l := a.images.LayerDir("step-bench")
		if err := os.MkdirAll(l, 0o755); err != nil {
			b.Fatal(err)
		}
		data[0], data[1] = byte(i), byte(i>>8)
		if err := os.WriteFile(filepath.Join(l, "data.bin"), data, 0o644); err != nil {
			b.Fatal(err)
		}
		f, err := os.Create(filepath.Join(l, "disk.img"))
		if err != nil {
			b.Fatal(err)
		}
		f.WriteAt([]byte("head"), 0)
		f.WriteAt([]byte("tail"), 1<<30-4)
		f.Close()
		img := &image.Template{ID: "build-bench", Layers: []string{"step-bench"}}
		b.StartTimer()
		start := time.Now()
		d, err := a.keeper.Upload(ctx, "bench", img, func(string) bool { return false },
			func(context.Context, string, blobstore.Digest) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
		ups = append(ups, time.Since(start))
		start = time.Now()
		if err := c.keeper.Fetch(ctx, "bench", "build-bench", d, "a"); err != nil {
			b.Fatal(err)
		}
		downs = append(downs, time.Since(start))
		b.StopTimer()
		infos, _ := blobs.List(ctx, "bench")
		for _, info := range infos {
			blobs.Delete(ctx, "bench", info.Digest)
		}
		b.StartTimer()
	}
	b.ReportMetric(pct(ups, 50), "upload-p50-ms")
	b.ReportMetric(pct(ups, 99), "upload-p99-ms")
	b.ReportMetric(pct(downs, 50), "fetch-p50-ms")
	b.ReportMetric(pct(downs, 99), "fetch-p99-ms")
}

func benchNode(b *testing.B, blobs blobstore.Store) node {
	dir := b.TempDir()
	images, err := image.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	tmp := filepath.Join(dir, "blobtmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		b.Fatal(err)
	}
	return node{images, &Keeper{Blobs: blobs, Images: images, Temp: tmp}}
}

// pct is the p-th percentile of ds (nearest rank), in ms.
func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (p*len(s)+99)/100 - 1
	return float64(s[max(i, 0)].Microseconds()) / 1000
}
