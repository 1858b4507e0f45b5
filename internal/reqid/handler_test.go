package reqid

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// lines decodes each line of buf as a JSON object.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func TestHandlerAddsTheContextsID(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	ctx := NewContext(context.Background(), "00112233aabbccdd")
	log.InfoContext(ctx, "with an ID", "k", 1)
	log.Info("without a context")
	log.WarnContext(context.Background(), "a context without an ID")
	log.ErrorContext(ctx, "names its own", LogKey, "ffffffffffffffff")

	got := lines(t, &buf)
	if len(got) != 4 {
		t.Fatalf("%d lines: %s", len(got), buf.String())
	}
	if got[0][LogKey] != "00112233aabbccdd" || got[0]["component"] != "test" || got[0]["k"] != 1.0 {
		t.Errorf("line with a request's context: %v", got[0])
	}
	for _, l := range got[1:3] {
		if _, ok := l[LogKey]; ok {
			t.Errorf("a line without a request names one: %v", l)
		}
	}
	if got[3][LogKey] != "ffffffffffffffff" || strings.Count(buf.String(), `"`+LogKey+`"`) != 2 {
		t.Errorf("a line naming its own ID got a second one:\n%s", buf.String())
	}
}

func TestHandlerWrapsOnce(t *testing.T) {
	var buf bytes.Buffer
	log := Logger(Logger(slog.New(NewHandler(slog.NewJSONHandler(&buf, nil)))))
	log.InfoContext(NewContext(context.Background(), "0123456789abcdef"), "once")
	if n := strings.Count(buf.String(), LogKey); n != 1 {
		t.Errorf("the ID is on the line %d times: %s", n, buf.String())
	}
	if Logger(nil) != nil {
		t.Error("Logger(nil) is not nil")
	}
}

func TestHandlerKeepsLevel(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	log.InfoContext(NewContext(context.Background(), "0123456789abcdef"), "dropped")
	if buf.Len() != 0 {
		t.Errorf("a line below the level was written: %s", buf.String())
	}
}
