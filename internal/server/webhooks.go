package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/secret"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/webhook"
)

// startWebhooks starts this process's webhook dispatcher (every role
// delivers: the store's leases make each webhook one process's at a
// time) and returns the API's webhook service and the dispatcher's stop,
// to call before the store closes.
func startWebhooks(ctx context.Context, cfg Config, st store.Store, sealer *secret.Sealer, met *metrics.Metrics, log *slog.Logger) (*webhook.Service, func()) {
	guard := &webhook.Guard{Allow: cfg.WebhookAllow}
	svc := &webhook.Service{Store: st, Sealer: sealer, Guard: guard, MaxPerTeam: cfg.MaxWebhooksPerTeam}
	retries := webhook.DefaultRetries
	d := webhook.NewDispatcher(webhook.DispatcherConfig{
		Store: st, Sealer: sealer, Owner: dispatcherOwner(cfg),
		Sender:  &webhook.Sender{Guard: guard, Timeout: cfg.WebhookTimeout},
		Retries: retries, RetryInterval: cfg.WebhookRetryInterval, Retention: cfg.EventRetention,
		Observer: met, Logger: log.With("component", "webhooks"),
	})
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	return svc, func() {
		cancel()
		<-done
	}
}

// dispatcherOwner names this process in the webhooks' leases: the same
// across its restarts (its leases are its own again at once), another
// process's never (its role, node name and data dir).
func dispatcherOwner(cfg Config) string {
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		dir = cfg.DataDir
	}
	host, _ := os.Hostname()
	sum := sha256.Sum256([]byte(cfg.Role + "\x00" + cfg.NodeName + "\x00" + host + "\x00" + dir))
	return cfg.Role + "/" + cfg.NodeName + "/" + hex.EncodeToString(sum[:6])
}
