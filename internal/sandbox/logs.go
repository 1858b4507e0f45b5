package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/team"
)

// LogEntry is one line of a sandbox's log: envd's own messages and the
// process events and output it records (see cmd/envd).
type LogEntry struct {
	Time    time.Time
	Level   string
	Message string
	Fields  map[string]string
	// Line is the raw line.
	Line string
}

// maxLogLine bounds one line read from the log file, maxLogScan how much
// of its end a request reads.
const (
	maxLogLine = 64 << 10
	maxLogScan = 16 << 20
)

// Logs returns up to limit entries of a sandbox's log at or after start,
// oldest first.
func (m *Manager) Logs(ctx context.Context, teamID team.ID, id string, start time.Time, limit int) ([]LogEntry, error) {
	l, err := m.lookup(teamID.Scope(), id)
	if err != nil {
		return nil, err
	}
	// The node put envd's log on the sandbox's own disk (node.Instance);
	// the sandbox cannot reach that file. A paused sandbox's disk is not
	// mounted: it has no log to show until it is resumed.
	inst := m.instance(l)
	if inst == nil {
		return []LogEntry{}, nil
	}
	out, err := readLog(inst.LogPath, start, limit)
	if err != nil {
		return nil, fmt.Errorf("sandbox: reading logs of %s: %w", id, err)
	}
	return out, nil
}

// readLog reads up to limit entries at or after start from the newest
// maxLogScan bytes of a log file.
func readLog(path string, start time.Time, limit int) ([]LogEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return []LogEntry{}, nil
		}
		return nil, err
	}
	defer f.Close()
	fallback := time.Now()
	skipPartial := false
	if fi, err := f.Stat(); err == nil {
		fallback = fi.ModTime()
		// The log is as large as the sandbox's disk lets it grow: read
		// only its newest part, so a request costs the host a bounded
		// amount whatever the sandbox wrote.
		if fi.Size() > maxLogScan {
			if _, err := f.Seek(fi.Size()-maxLogScan, io.SeekStart); err != nil {
				return nil, err
			}
			skipPartial = true
		}
	}
	out := []LogEntry{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), maxLogLine)
	if skipPartial {
		sc.Scan() // the line the seek landed in
	}
	for sc.Scan() && (limit <= 0 || len(out) < limit) {
		e := parseLogLine(sc.Text(), fallback)
		if !start.IsZero() && e.Time.Before(start) {
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

// parseLogLine reads a JSON line of log/slog's JSON handler (time, level,
// msg and attributes); anything else becomes an info entry.
func parseLogLine(line string, fallback time.Time) LogEntry {
	e := LogEntry{Time: fallback, Level: "info", Message: line, Fields: map[string]string{}, Line: line}
	var obj map[string]any
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &obj) != nil {
		return e
	}
	for k, v := range obj {
		switch k {
		case "time":
			if s, ok := v.(string); ok {
				if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
					e.Time = t
				}
			}
		case "level":
			e.Level = strings.ToLower(fmt.Sprint(v))
		case "msg":
			e.Message = fmt.Sprint(v)
		default:
			if s, ok := v.(string); ok {
				e.Fields[k] = s
			} else {
				b, _ := json.Marshal(v)
				e.Fields[k] = string(b)
			}
		}
	}
	return e
}
