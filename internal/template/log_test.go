package template

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// newLogBuild makes a template with one build in st, for a buildLog.
func newLogBuild(t *testing.T, st store.Store) string {
	t.Helper()
	ctx := context.Background()
	tpl := store.Template{ID: "tpl-log", TeamID: "t1", Names: []string{"logs"}}
	if err := st.CreateTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateBuild(ctx, store.Build{ID: "build-log", TemplateID: tpl.ID, Status: store.BuildBuilding}); err != nil {
		t.Fatal(err)
	}
	return "build-log"
}

func allLogs(t *testing.T, st store.Store, buildID string) []store.BuildLogEntry {
	t.Helper()
	logs, err := st.BuildLogs(context.Background(), buildID, 0, 1<<30, "")
	if err != nil {
		t.Fatal(err)
	}
	return logs
}

// numbered is n lines "line 0".."line n-1", each ending with a newline.
func numbered(from, n int) []byte {
	var b bytes.Buffer
	for i := from; i < from+n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.Bytes()
}

func TestCommandOutputKeepsHeadAndTail(t *testing.T) {
	st := newStore(t)
	id := newLogBuild(t, st)
	lg := newBuildLog(st, id)
	lg.setStep("1")
	lg.info("RUN yes")
	const total = 10000
	// Output arrives in chunks that split lines, as envd's do.
	out := numbered(0, total)
	for len(out) > 0 {
		n := min(777, len(out))
		lg.output(false, out[:n])
		out = out[n:]
	}
	lg.setStep("2")
	lg.info("after")
	lg.close()

	logs := allLogs(t, st, id)
	// RUN line, 2000 head lines, the drop note, 500 tail lines, "after".
	if got, want := len(logs), 1+2000+1+500+1; got != want {
		t.Fatalf("kept %d entries, want %d", got, want)
	}
	if logs[1].Message != "line 0" || logs[2000].Message != "line 1999" {
		t.Errorf("head: %q … %q", logs[1].Message, logs[2000].Message)
	}
	note := logs[2001]
	if !strings.Contains(note.Message, "7500 lines dropped") || note.Step != "1" {
		t.Errorf("drop note %+v, want 7500 lines dropped in step 1", note)
	}
	if logs[2002].Message != "line 9500" || logs[2501].Message != "line 9999" {
		t.Errorf("tail: %q … %q", logs[2002].Message, logs[2501].Message)
	}
	if logs[2502].Message != "after" || logs[2502].Step != "2" {
		t.Errorf("last entry %+v", logs[2502])
	}
}

func TestLongLinesAreTruncated(t *testing.T) {
	st := newStore(t)
	id := newLogBuild(t, st)
	lg := newBuildLog(st, id)
	long := strings.Repeat("x", 100000)
	// In several writes, then a short line: the short one stays whole.
	for i := 0; i < len(long); i += 3000 {
		lg.output(false, []byte(long[i:min(i+3000, len(long))]))
	}
	lg.output(false, []byte("\nshort\n"))
	// A multi-byte character cut at the limit leaves valid UTF-8.
	lg.output(true, []byte(strings.Repeat("é", 5000)+"\n"))
	lg.close()

	logs := allLogs(t, st, id)
	if len(logs) != 3 {
		t.Fatalf("got %d entries, want 3 (one per line)", len(logs))
	}
	first := logs[0].Message
	if len(first) > 4096+64 || !strings.HasPrefix(first, strings.Repeat("x", 4000)) || !strings.Contains(first, "truncated") {
		t.Errorf("long line kept as %d bytes ending %q", len(first), first[max(0, len(first)-60):])
	}
	if logs[1].Message != "short" {
		t.Errorf("second entry %q, want short", logs[1].Message)
	}
	if m := logs[2].Message; !strings.HasPrefix(m, "éé") || !strings.Contains(m, "truncated") || !utf8Valid(m) {
		t.Errorf("multi-byte line kept as %q…", m[:20])
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestBuildLogIsBoundedPerBuild(t *testing.T) {
	st := newStore(t)
	id := newLogBuild(t, st)
	lg := newBuildLog(st, id)
	// 40 commands of 1000 short lines: each within the command cap, the
	// build's 20000-line cap is reached after 20.
	for c := 0; c < 40; c++ {
		lg.setStep(fmt.Sprint(c + 1))
		lg.output(false, numbered(c*1000, 1000))
	}
	lg.setStep("finalize")
	lg.errorf("build failed: the end")
	lg.close()

	logs := allLogs(t, st, id)
	if len(logs) > 20000+100 {
		t.Fatalf("kept %d entries; the build cap is 20000 lines", len(logs))
	}
	var dropped, failed bool
	for _, l := range logs {
		if strings.Contains(l.Message, "lines dropped") {
			dropped = true
		}
		if l.Message == "build failed: the end" {
			failed = true
		}
	}
	if !dropped || !failed {
		t.Errorf("drop note kept: %v, the final error kept: %v", dropped, failed)
	}
}

func TestBuildLogIsBoundedInBytes(t *testing.T) {
	st := newStore(t)
	id := newLogBuild(t, st)
	lg := newBuildLog(st, id)
	line := strings.Repeat("b", 4000) + "\n"
	// 2000 lines of 4000 bytes per command (its head), 5 commands: 40 MB.
	for c := 0; c < 5; c++ {
		lg.setStep(fmt.Sprint(c + 1))
		lg.output(false, bytes.Repeat([]byte(line), 2000))
	}
	lg.close()
	var size int
	logs := allLogs(t, st, id)
	for _, l := range logs {
		size += len(l.Message)
	}
	if size > 8<<20+64<<10 {
		t.Fatalf("kept %d bytes in %d entries; the build cap is 8 MiB", size, len(logs))
	}
	if !strings.Contains(logs[len(logs)-1].Message, "lines dropped") {
		t.Errorf("last entry %q, want the drop note", logs[len(logs)-1].Message)
	}
}

// TestPendingIsBounded feeds a log whose store never takes a batch: what
// waits in memory stays within the build's cap.
func TestPendingIsBounded(t *testing.T) {
	st := newStore(t)
	lg := newBuildLog(st, "no-such-build") // every flush fails
	defer lg.close()
	chunk := bytes.Repeat([]byte("y\n"), 64<<10)
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; i < 200 && time.Now().Before(deadline); i++ {
		lg.setStep(fmt.Sprint(i))
		lg.output(false, chunk)
	}
	lg.mu.Lock()
	n := len(lg.pending)
	lg.mu.Unlock()
	if n > 20000+100 {
		t.Fatalf("%d entries pending", n)
	}
}
