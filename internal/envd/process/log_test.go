package process

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/warren-sandbox/warren/internal/testenv"
	pb "github.com/warren-sandbox/warren/proto/envd/process"
)

// records parses the JSON log lines written so far. The buffer is written
// by envd's goroutines and read by the test, which learns that a process
// ended over HTTP (not a synchronisation the race detector sees).
func records(t *testing.T, b *testenv.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

// runLogged runs req on a service that logs JSON as envd does, and returns
// the result and the log records of that process.
func runLogged(t *testing.T, req *pb.StartRequest) (result, []map[string]any) {
	t.Helper()
	svc, c := newTestService(t, "root")
	var buf testenv.Buffer
	svc.SetLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	r := run(t, c, connect.NewRequest(req))
	if r.err != nil {
		t.Fatalf("stream error: %v", r.err)
	}
	recs := records(t, &buf)
	for _, rec := range recs {
		if rec["pid"] != float64(r.pid) {
			t.Errorf("record %v: pid is not %d", rec, r.pid)
		}
		if rec["level"] != "INFO" || rec["time"] == nil {
			t.Errorf("record %v: want level INFO and a time", rec)
		}
	}
	return r, recs
}

// outputs returns the messages of the output records of one stream.
func outputs(recs []map[string]any, stream string) []string {
	var out []string
	for _, rec := range recs {
		if rec["stream"] == stream {
			out = append(out, rec["msg"].(string))
		}
	}
	return out
}

func TestLogStartOutputEnd(t *testing.T) {
	req := shell("echo out; echo err >&2; echo; printf partial")
	tag := "job-1"
	req.Tag = &tag
	_, recs := runLogged(t, req)

	if len(recs) < 2 {
		t.Fatalf("records: %v", recs)
	}
	start, end := recs[0], recs[len(recs)-1]
	want := map[string]any{
		"msg": "process started", "cmd": "/bin/bash", "args": "-c echo out; echo err >&2; echo; printf partial",
		"tag": "job-1", "user": "root", "cwd": "/root", "pty": false,
	}
	for k, v := range want {
		if start[k] != v {
			t.Errorf("start record %s = %v, want %v", k, start[k], v)
		}
	}
	// The start's steps, timed: a fork and exec takes some time.
	for _, k := range []string{"user_lookup_us", "prepare_us", "stdio_us", "exec_us"} {
		if v, ok := start[k].(float64); !ok || v < 0 || (k == "exec_us" && v == 0) {
			t.Errorf("start record %s = %v, want a duration in µs", k, start[k])
		}
	}
	if end["msg"] != "process ended" || end["exit_code"] != float64(0) || end["duration_ms"] == nil {
		t.Errorf("end record = %v", end)
	}
	if _, ok := end["signal"]; ok {
		t.Errorf("end record of a clean exit has a signal: %v", end)
	}
	if got := strings.Join(outputs(recs, "stdout"), "|"); got != "out||partial" {
		t.Errorf("stdout records = %q, want out||partial", got)
	}
	if got := strings.Join(outputs(recs, "stderr"), "|"); got != "err" {
		t.Errorf("stderr records = %q, want err", got)
	}
	if len(recs) != 2+4 {
		t.Errorf("got %d records, want 6: %v", len(recs), recs)
	}
}

func TestLogSignalAndPTY(t *testing.T) {
	_, recs := runLogged(t, shell("kill -9 $$"))
	end := recs[len(recs)-1]
	if end["msg"] != "process ended" || end["exit_code"] != float64(-1) || end["signal"] != "SIGKILL" {
		t.Errorf("end record = %v", end)
	}

	req := shell("echo hi")
	req.Pty = &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}
	_, recs = runLogged(t, req)
	if recs[0]["pty"] != true {
		t.Errorf("start record = %v", recs[0])
	}
	// The PTY's \r\n line ends leave no \r behind.
	if got := outputs(recs, "pty"); len(got) != 1 || got[0] != "hi" {
		t.Errorf("pty records = %q", got)
	}
}

func TestLogOutputBounded(t *testing.T) {
	r, recs := runLogged(t, shell("seq 1 1000; seq 1 3 >&2"))
	if !strings.HasSuffix(string(r.stdout), "\n1000\n") {
		t.Errorf("the client did not get all output: %d bytes", len(r.stdout))
	}
	got := outputs(recs, "stdout")
	if len(got) != logLinesMax+1 || got[0] != "1" || got[logLinesMax-1] != "100" || got[logLinesMax] != "output truncated in log" {
		t.Errorf("%d stdout records, first %q, last %q", len(got), got[0], got[len(got)-1])
	}
	// Each stream has its own budget.
	if got := outputs(recs, "stderr"); strings.Join(got, " ") != "1 2 3" {
		t.Errorf("stderr records = %q", got)
	}

	// Long lines are cut to logLineMax bytes and count in full against the
	// byte budget: 16 fill it, the 17th is not logged.
	_, recs = runLogged(t, shell(`for i in $(seq 30); do printf '%02000d\n' 0; done`))
	got = outputs(recs, "stdout")
	if len(got) != logOutputMax/logLineMax+1 || got[len(got)-1] != "output truncated in log" {
		t.Fatalf("%d stdout records, want %d", len(got), logOutputMax/logLineMax+1)
	}
	for _, line := range got[:len(got)-1] {
		if line != strings.Repeat("0", logLineMax) {
			t.Fatalf("long line logged as %d bytes %.20q…", len(line), line)
		}
	}
}

// TestOutputLogSplitting feeds chunks that split lines and UTF-8 sequences
// anywhere, as pipe reads do.
func TestOutputLogSplitting(t *testing.T) {
	var buf testenv.Buffer
	o := newOutputLog(slog.New(slog.NewJSONHandler(&buf, nil)), 7, outStdout)
	long := strings.Repeat("é", logLineMax) // 2 bytes each: the cut falls on a sequence boundary
	for _, chunk := range []string{"a", "b\nc", "d\r\n\n", long[:5], long[5:], "tail\nlast"} {
		o.write([]byte(chunk))
	}
	o.flush()
	var got []string
	for _, rec := range records(t, &buf) {
		got = append(got, rec["msg"].(string))
	}
	want := []string{"ab", "cd", "", strings.Repeat("é", logLineMax/2), "last"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("records %q\nwant %q", got, want)
	}

	// An odd cut may not split "é" in two.
	buf = testenv.Buffer{}
	o = newOutputLog(slog.New(slog.NewJSONHandler(&buf, nil)), 7, outStdout)
	o.write([]byte("x" + long + "\n"))
	if msg := records(t, &buf)[0]["msg"].(string); msg != "x"+strings.Repeat("é", logLineMax/2-1) {
		t.Errorf("odd cut gave %d bytes", len(msg))
	}

	// Logging off: nothing is kept.
	o = newOutputLog(slog.New(slog.DiscardHandler), 7, outStdout)
	o.write([]byte("abc"))
	if o.line != nil {
		t.Errorf("a discarding logger still buffers %q", o.line)
	}
}
