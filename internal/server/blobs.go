package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/warren-sandbox/warren/internal/blobstore"
	"github.com/warren-sandbox/warren/internal/metrics"
)

// openBlobStore opens --blob-store, if set, and clears the directory of
// packs on their way (what a crash left there).
func openBlobStore(ctx context.Context, cfg Config, met *metrics.Metrics, log *slog.Logger) (blobstore.Store, string, error) {
	if cfg.BlobStore.URL == "" {
		return nil, "", nil
	}
	blobs, err := blobstore.Open(ctx, cfg.BlobStore)
	if err != nil {
		return nil, "", fmt.Errorf("--blob-store: %w", err)
	}
	tmp := filepath.Join(cfg.DataDir, "blobtmp")
	if err := os.RemoveAll(tmp); err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, "", err
	}
	// The URL and endpoint name no secret; the keys are never logged.
	log.Info("paused sandboxes are kept in the blob store", "blob_store", cfg.BlobStore.URL, "endpoint", cfg.BlobStore.Endpoint)
	return met.BlobStore(blobs), tmp, nil
}
