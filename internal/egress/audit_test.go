package egress

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// One sandbox flooding the audit loses its own entries, never another's:
// the queues are per sandbox, and the writer takes from them in turn.
func TestAuditFloodKeepsOtherSandboxesEntries(t *testing.T) {
	a, err := OpenAudit(t.TempDir(), 64<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const flood, quiet = 50000, 200
	for i := range flood {
		a.Log(Entry{Sandbox: "flooder", Proto: "udp", Dst: fmt.Sprintf("198.18.0.1:%d", i%65536), Decision: Deny})
		if i%(flood/quiet) == 0 {
			a.Log(Entry{Sandbox: "quiet", Proto: "tcp", Dst: fmt.Sprintf("198.18.0.2:%d", i/(flood/quiet)), Decision: Allow})
		}
	}
	a.Flush()
	got, err := a.Read("quiet", time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != quiet {
		t.Fatalf("the quiet sandbox has %d audit entries; want all %d", len(got), quiet)
	}
	for i, e := range got {
		if want := fmt.Sprintf("198.18.0.2:%d", i); e.Dst != want || strings.Contains(e.Reason, "dropped") {
			t.Errorf("quiet entry %d: %+v; want dst %s in order and no drop note", i, e, want)
		}
	}
	// The flooder's drops are told in its own file.
	flooded, err := a.Read("flooder", time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(flooded) == 0 || len(flooded) > flood {
		t.Fatalf("the flooder has %d entries", len(flooded))
	}
	if len(flooded) < flood {
		noted := false
		for _, e := range flooded {
			noted = noted || strings.Contains(e.Reason, "dropped")
		}
		if !noted {
			t.Errorf("the flooder lost %d entries and no entry of its own says so", flood-len(flooded))
		}
	}
	t.Logf("flooder: %d of %d entries kept", len(flooded), flood)
}

// Log after Close drops the entry instead of failing.
func TestAuditLogAfterClose(t *testing.T) {
	a, err := OpenAudit(t.TempDir(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	a.Log(Entry{Sandbox: "late"})
	a.Flush()
}
