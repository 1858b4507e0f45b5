package reqid

import (
	"context"
	"log/slog"
)

// Handler wraps a slog.Handler: a line logged with a context that carries
// a request ID gets it as LogKey, unless the line names one already.
// (Under a logger's WithGroup the attribute lands in the group; Warren's
// loggers use none.)
type Handler struct{ inner slog.Handler }

// NewHandler wraps inner; a Handler is returned as it is, so that a line
// never names its request twice.
func NewHandler(inner slog.Handler) slog.Handler {
	if _, ok := inner.(Handler); ok {
		return inner
	}
	return Handler{inner}
}

// Logger is l with its handler wrapped by NewHandler (nil: nil).
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return nil
	}
	if _, ok := l.Handler().(Handler); ok {
		return l
	}
	return slog.New(NewHandler(l.Handler()))
}

func (h Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h Handler) Handle(ctx context.Context, r slog.Record) error {
	if id := FromContext(ctx); id != "" && !names(r) {
		r = r.Clone()
		r.AddAttrs(slog.String(LogKey, id))
	}
	return h.inner.Handle(ctx, r)
}

func (h Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return Handler{h.inner.WithAttrs(attrs)}
}

func (h Handler) WithGroup(name string) slog.Handler {
	return Handler{h.inner.WithGroup(name)}
}

// names tells whether r has a LogKey attribute of its own.
func names(r slog.Record) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == LogKey
		return !found
	})
	return found
}
