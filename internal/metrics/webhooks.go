package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// webhookMetrics are the webhook deliveries' (internal/webhook).
type webhookMetrics struct {
	deliveries *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	queue      prometheus.Gauge
}

func newWebhookMetrics() webhookMetrics {
	return webhookMetrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_webhook_deliveries_total",
			Help: "Webhook delivery attempts this process made, by outcome (delivered, retry, failed, dropped).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warren_webhook_delivery_latency_seconds",
			Help:    "From an event's commit to the end of an attempt to deliver it, by outcome (delivered, retry, failed).",
			Buckets: operationBuckets,
		}, []string{"outcome"}),
		queue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "warren_webhook_queue_depth",
			Help: "Webhook deliveries still to make (all webhooks, as this process last counted them).",
		}),
	}
}

func (w webhookMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{w.deliveries, w.latency, w.queue}
}

// WebhookAttempt counts an attempt to deliver an event with its outcome,
// and its latency from the event's commit (none for "dropped").
func (m *Metrics) WebhookAttempt(outcome string, sinceEvent time.Duration) {
	m.webhooks.deliveries.WithLabelValues(outcome).Inc()
	if outcome != "dropped" {
		m.webhooks.latency.WithLabelValues(outcome).Observe(sinceEvent.Seconds())
	}
}

// WebhookQueue sets the number of deliveries still to make.
func (m *Metrics) WebhookQueue(n int) { m.webhooks.queue.Set(float64(n)) }
