package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestReadLogReadsOnlyTheNewestPart checks that a log grown far past
// maxLogScan (a sandbox may fill its whole disk with it) costs a request
// only its newest part, and that the entries found there are whole lines.
func TestReadLogReadsOnlyTheNewestPart(t *testing.T) {
	p := filepath.Join(t.TempDir(), "envd.log")
	var b bytes.Buffer
	junk := bytes.Repeat([]byte("x"), 1000)
	for b.Len() < 2*maxLogScan {
		b.Write(junk)
		b.WriteByte('\n')
	}
	for i := range 3 {
		fmt.Fprintf(&b, `{"time":"2100-01-01T10:00:0%dZ","level":"INFO","msg":"newest %d"}`+"\n", i, i)
	}
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2100, 1, 1, 10, 0, 0, 0, time.UTC) // after the junk lines, whose time is the file's
	got, err := readLog(p, start, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Message != "newest 0" || got[2].Message != "newest 2" {
		t.Fatalf("got %d entries, want the 3 newest: %+v", len(got), got)
	}
	all, err := readLog(p, time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := maxLogScan/1001 + 3; len(all) > want {
		t.Errorf("read %d entries, more than the newest %d bytes hold (%d)", len(all), maxLogScan, want)
	}
	for _, e := range all[:len(all)-3] {
		if e.Line != string(junk) {
			t.Fatalf("a partial line was returned: %d bytes", len(e.Line))
		}
	}
	if none, err := readLog(filepath.Join(t.TempDir(), "missing"), time.Time{}, 0); err != nil || len(none) != 0 {
		t.Errorf("missing log: %v, %v", none, err)
	}
}
