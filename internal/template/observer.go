package template

import (
	"context"
	"time"
)

// Observer is told of every build's end, for metrics
// (internal/metrics.Metrics is one). It must be quick.
type Observer interface {
	// BuildFinished reports a build that took d from its start request
	// (waiting for a slot included) and ended with outcome: "ok", "error"
	// or "canceled" (the template was deleted or the server stopped).
	BuildFinished(d time.Duration, outcome string)
}

// observeBuild reports a build begun at begin that ended with err; ctx
// is the build's, ended if the build was cancelled.
func (b *Builder) observeBuild(ctx context.Context, begin time.Time, err error) {
	if b.cfg.Observer == nil {
		return
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
		if ctx.Err() != nil {
			outcome = "canceled"
		}
	}
	b.cfg.Observer.BuildFinished(time.Since(begin), outcome)
}
