package metrics

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

func TestBlobStoreCountsBytesAndFailures(t *testing.T) {
	m := New()
	local, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := m.BlobStore(local)
	ctx := context.Background()
	data := []byte("paused sandbox")
	d := blobstore.DigestOf(data)
	if err := s.Put(ctx, "t1", d, int64(len(data)), bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := s.Get(ctx, "t1", d, filepath.Join(t.TempDir(), "x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, "t2", d); err == nil {
		t.Fatal("another team's blob found")
	}
	if err := s.Put(ctx, "t1", blobstore.DigestOf([]byte("other")), int64(len(data)), bytes.NewReader(data)); err == nil {
		t.Fatal("a blob of the wrong digest was stored")
	}
	got := map[string]float64{}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "warren_blob_store_") {
			continue
		}
		for _, mt := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range mt.GetLabel() {
				key += " " + l.GetValue()
			}
			if c := mt.GetCounter(); c != nil {
				got[key] = c.GetValue()
			}
		}
	}
	want := map[string]float64{
		"warren_blob_store_bytes_total upload":   14,
		"warren_blob_store_bytes_total download": 14,
		"warren_blob_store_errors_total put":     1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("counters %v, want %v", got, want)
	}
}

// A listing of a team's blobs sets its bytes in the store; the cache's
// hits and misses are counted.
func TestBlobStoreTeamBytesAndCache(t *testing.T) {
	m := New()
	local, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := m.BlobStore(local)
	ctx := context.Background()
	for _, data := range []string{"first blob", "second"} {
		if err := s.Put(ctx, "t1", blobstore.DigestOf([]byte(data)), int64(len(data)), strings.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	for _, team := range []string{"t1", "t2"} {
		if _, err := s.List(ctx, team); err != nil {
			t.Fatal(err)
		}
	}
	m.BlobCache(true)
	m.BlobCache(false)
	m.BlobCache(false)
	got := map[string]float64{}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range mt.GetLabel() {
				key += " " + l.GetValue()
			}
			if g := mt.GetGauge(); g != nil {
				got[key] = g.GetValue()
			}
			if c := mt.GetCounter(); c != nil {
				got[key] = c.GetValue()
			}
		}
	}
	for k, v := range map[string]float64{
		"warren_blob_store_team_bytes t1": 16,
		"warren_blob_store_team_bytes t2": 0,
		"warren_blob_cache_total hit":     1,
		"warren_blob_cache_total miss":    2,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// A put and a get of at least 1 MiB observe their throughput; smaller
// ones do not.
func TestBlobStoreThroughput(t *testing.T) {
	m := New()
	local, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := m.BlobStore(local)
	ctx := context.Background()
	for _, n := range []int{2 << 20, 1000} {
		data := bytes.Repeat([]byte{byte(n)}, n)
		d := blobstore.DigestOf(data)
		if err := s.Put(ctx, "t1", d, int64(n), bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		if err := s.Get(ctx, "t1", d, filepath.Join(t.TempDir(), "x")); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "warren_blob_store_throughput_bytes_per_second" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if h := mt.GetHistogram(); h != nil && h.GetSampleSum() > 0 {
				got[mt.GetLabel()[0].GetValue()] = h.GetSampleCount()
			}
		}
	}
	if got["upload"] != 1 || got["download"] != 1 {
		t.Fatalf("throughput samples %v, want one upload and one download (the 2 MiB blob's)", got)
	}
}
