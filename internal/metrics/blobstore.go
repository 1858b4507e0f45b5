package metrics

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warren-sandbox/warren/internal/blobstore"
)

// BlobStore wraps s so that its calls are timed
// (warren_blob_store_operation_duration_seconds), their failures counted
// (warren_blob_store_errors_total) and the bytes moved counted by
// direction (warren_blob_store_bytes_total: upload, download): the
// throughput is the rate of the bytes over the time of put and get.
// Each listing of a team's blobs (the blob collector lists every team's
// every 10 minutes) sets warren_blob_store_team_bytes, the bytes the
// team has in the store; BlobCache counts the paused sandboxes' copies
// used or fetched. Call it once per Metrics.
func (m *Metrics) BlobStore(s blobstore.Store) blobstore.Store {
	b := &timedBlobs{Store: s,
		time: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warren_blob_store_operation_duration_seconds",
			Help:    "Time of blob store calls (put, get, stat, delete, list).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}, []string{"op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_blob_store_errors_total",
			Help: "Blob store calls that failed (a missing blob is an answer, not a failure).",
		}, []string{"op"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_blob_store_bytes_total",
			Help: "Bytes uploaded to and downloaded from the blob store.",
		}, []string{"direction"}),
	}
	b.teamBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warren_blob_store_team_bytes",
		Help: "Bytes a team has in the blob store, as last listed (the blob collector lists every team every 10 minutes).",
	}, []string{"team"})
	m.blobCache = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warren_blob_cache_total",
		Help: "Resumes of sandboxes paused in the blob store: with the node's own copy (hit) or fetched from the store (miss).",
	}, []string{"result"})
	m.reg.MustRegister(b.time, b.errs, b.bytes, b.teamBytes, m.blobCache)
	return b
}

// BlobCache counts a resume of a sandbox paused in the blob store that
// found the node's copy (hit) or fetched the blob (miss). It is the
// sandbox manager's BlobCacheObserver.
func (m *Metrics) BlobCache(hit bool) {
	if m.blobCache == nil {
		return
	}
	result := "miss"
	if hit {
		result = "hit"
	}
	m.blobCache.WithLabelValues(result).Inc()
}

type timedBlobs struct {
	blobstore.Store
	time  *prometheus.HistogramVec
	errs  *prometheus.CounterVec
	bytes *prometheus.CounterVec
	// teamBytes is set by List.
	teamBytes *prometheus.GaugeVec
}

func (b *timedBlobs) observe(op string, start time.Time, err error) {
	b.time.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, blobstore.ErrNotFound) {
		b.errs.WithLabelValues(op).Inc()
	}
}

func (b *timedBlobs) Put(ctx context.Context, team string, d blobstore.Digest, size int64, r io.Reader) error {
	start := time.Now()
	err := b.Store.Put(ctx, team, d, size, r)
	b.observe("put", start, err)
	if err == nil {
		b.bytes.WithLabelValues("upload").Add(float64(size))
	}
	return err
}

func (b *timedBlobs) Get(ctx context.Context, team string, d blobstore.Digest, dst string) error {
	start := time.Now()
	err := b.Store.Get(ctx, team, d, dst)
	b.observe("get", start, err)
	if fi, serr := os.Stat(dst); err == nil && serr == nil {
		b.bytes.WithLabelValues("download").Add(float64(fi.Size()))
	}
	return err
}

func (b *timedBlobs) Stat(ctx context.Context, team string, d blobstore.Digest) (blobstore.Info, error) {
	start := time.Now()
	info, err := b.Store.Stat(ctx, team, d)
	b.observe("stat", start, err)
	return info, err
}

func (b *timedBlobs) Delete(ctx context.Context, team string, d blobstore.Digest) error {
	start := time.Now()
	err := b.Store.Delete(ctx, team, d)
	b.observe("delete", start, err)
	return err
}

func (b *timedBlobs) List(ctx context.Context, team string) ([]blobstore.Info, error) {
	start := time.Now()
	infos, err := b.Store.List(ctx, team)
	b.observe("list", start, err)
	if err == nil && team != "" {
		var n int64
		for _, i := range infos {
			n += i.Size
		}
		b.teamBytes.WithLabelValues(team).Set(float64(n))
	}
	return infos, err
}

// AbortStale passes on to the store's, if it has one (an S3 store's
// unfinished uploads).
func (b *timedBlobs) AbortStale(ctx context.Context, before time.Time) (int, error) {
	a, ok := b.Store.(interface {
		AbortStale(context.Context, time.Time) (int, error)
	})
	if !ok {
		return 0, nil
	}
	start := time.Now()
	n, err := a.AbortStale(ctx, before)
	b.observe("abort_stale", start, err)
	return n, err
}
