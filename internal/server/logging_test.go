package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/reqid"
)

func TestNewLoggerFormats(t *testing.T) {
	ctx := reqid.NewContext(context.Background(), "0123456789abcdef")

	var js bytes.Buffer
	log, err := NewLogger(&js, "json", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("below the level")
	log.InfoContext(ctx, "served", "status", 200)
	var line map[string]any
	if err := json.Unmarshal(js.Bytes(), &line); err != nil {
		t.Fatalf("json format wrote %q: %v", js.String(), err)
	}
	if line["msg"] != "served" || line["level"] != "INFO" || line[reqid.LogKey] != "0123456789abcdef" || line["status"] != 200.0 {
		t.Errorf("json line %v", line)
	}

	var text bytes.Buffer
	log, err = NewLogger(&text, "text", slog.LevelDebug)
	if err != nil {
		t.Fatal(err)
	}
	log.DebugContext(ctx, "served")
	if s := text.String(); !strings.Contains(s, "level=DEBUG msg=served request_id=0123456789abcdef") {
		t.Errorf("text line %q", s)
	}

	if _, err := NewLogger(&text, "yaml", slog.LevelInfo); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Errorf("an unknown format: %v", err)
	}
}
