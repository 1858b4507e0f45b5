package server

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/warren-sandbox/warren/internal/reqid"
)

// LogFormats are --log-format's values; the first is the default.
var LogFormats = []string{"json", "text"}

// NewLogger is the server's logger, writing to w lines of level and
// above: "json" (one object a line, what log collectors parse; the
// default) or "text" (key=value, for a human at a terminal). A line logged
// with a request's context names the request's ID (reqid.LogKey), the one
// a 500 gives its client.
func NewLogger(w io.Writer, format string, level slog.Leveler) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch format {
	case "json", "":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: want json or text", format)
	}
	return slog.New(reqid.NewHandler(h)), nil
}
