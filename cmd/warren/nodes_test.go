package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/store"
)

// The list's contract: a header, then one line per node whose first three
// fields are NAME STATE SANDBOXES; a node not heard from is lost.
func TestPrintNodes(t *testing.T) {
	now := time.Date(2026, 11, 24, 2, 0, 0, 0, time.UTC)
	nodes := []store.Node{
		{Name: "a", Address: "10.0.0.1:3010", Runtime: "runsc", CPUs: 8, MemoryMB: 16384, State: store.NodeReady, HeartbeatAt: now.Add(-time.Second),
			Labels:    map[string]string{"zone": "b", "disk": "ssd"},
			NodeUsage: store.NodeUsage{Sandboxes: 5, UsedCPUs: 10, UsedMemoryMB: 2560, FreeDiskMB: 51200}},
		{Name: "b", Runtime: "runsc", State: store.NodeCordoned, HeartbeatAt: now.Add(-2 * time.Second)},
		{Name: "c", Runtime: "runc", State: store.NodeReady, HeartbeatAt: now.Add(-time.Minute), NodeUsage: store.NodeUsage{Sandboxes: 2}},
	}
	var out bytes.Buffer
	if err := printNodes(&out, nodes, now, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0])[:3], " ") != "NAME STATE SANDBOXES" {
		t.Fatalf("output:\n%s", out.String())
	}
	for i, want := range []string{"a ready 5", "b cordoned 0", "c lost 2"} {
		if got := strings.Join(strings.Fields(lines[i+1])[:3], " "); got != want {
			t.Errorf("line %d starts %q, want %q", i+1, got, want)
		}
	}
	if f := strings.Fields(lines[1]); f[5] != "-2" || f[6] != "13824" || f[7] != "51200" || f[8] != "disk=ssd,zone=b" {
		t.Errorf("free CPU, memory, disk and labels of a: %v", f)
	}
	if f := strings.Fields(lines[2]); f[3] != "-" || f[8] != "-" {
		t.Errorf("b has no address and no labels: %v", f)
	}
}
