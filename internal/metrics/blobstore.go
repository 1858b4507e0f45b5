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
// throughput is the rate of the bytes over the time of put and get, and
// each put or get of at least 1 MiB observes its own throughput
// (warren_blob_store_throughput_bytes_per_second: upload, download; an
// upload counts the bytes it sent, not the parts an interrupted upload
// had stored already, nor a blob already there).
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
	b.rate = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "warren_blob_store_throughput_bytes_per_second",
		Help:    "Throughput of each blob store upload and download of at least 1 MiB (bytes sent or fetched over the call's time).",
		Buckets: prometheus.ExponentialBuckets(1<<20, 2, 13), // 1 MiB/s to 4 GiB/s
	}, []string{"direction"})
	b.teamBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warren_blob_store_team_bytes",
		Help: "Bytes a team has in the blob store, as last listed (the blob collector lists every team every 10 minutes).",
	}, []string{"team"})
	m.blobCache = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warren_blob_cache_total",
		Help: "Resumes of sandboxes paused in the blob store: with the node's own copy (hit) or fetched from the store (miss).",
	}, []string{"result"})
	m.reg.MustRegister(b.time, b.errs, b.bytes, b.rate, b.teamBytes, m.blobCache)
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
	rate  *prometheus.HistogramVec
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
	// What an S3 upload sends (its progress); a store that reports none
	// sent it all.
	sent, reported := int64(0), false
	ctx = blobstore.WithProgress(ctx, func(p blobstore.Progress) { sent, reported = p.Sent, true })
	err := b.Store.Put(ctx, team, d, size, r)
	b.observe("put", start, err)
	if err == nil {
		b.bytes.WithLabelValues("upload").Add(float64(size))
		if !reported {
			sent = size
		}
		b.observeRate("upload", sent, time.Since(start))
	}
	return err
}

// minRateBytes is the least a transfer moves to have its throughput
// observed: below it, the time is the call's latency.
const minRateBytes = 1 << 20

func (b *timedBlobs) observeRate(direction string, n int64, took time.Duration) {
	if n >= minRateBytes && took > 0 {
		b.rate.WithLabelValues(direction).Observe(float64(n) / took.Seconds())
	}
}

func (b *timedBlobs) Get(ctx context.Context, team string, d blobstore.Digest, dst string) error {
	start := time.Now()
	err := b.Store.Get(ctx, team, d, dst)
	b.observe("get", start, err)
	took := time.Since(start)
	if fi, serr := os.Stat(dst); err == nil && serr == nil {
		b.bytes.WithLabelValues("download").Add(float64(fi.Size()))
		b.observeRate("download", fi.Size(), took)
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
