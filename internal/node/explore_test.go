package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExplorePhases(t *testing.T) {
	n := testNode(t, "runsc")
	req := baseRequest(t, "xph")
	req.MemoryMB = 1024
	inst := create(t, n, req)
	sh(t, inst, "tok-"+inst.ID, "", `nohup python3 -c '
import os, time
b = bytearray(50 << 20)
for i in range(0, len(b), 4096): b[i] = 1
open("/tmp/r","w").close()
time.sleep(86400)' >/dev/null 2>&1 &
for i in $(seq 300); do [ -e /tmp/r ] && break; sleep 0.1; done`, 60*time.Second)
	ctx := context.Background()
	rs := n.cfg.Runtime
	for round := 0; round < 6; round++ {
		mark := time.Now()
		var laps []string
		lap := func(what string) { laps = append(laps, what+"="+time.Since(mark).Round(100*time.Microsecond).String()); mark = time.Now() }
		p, err := n.PauseToDisk(ctx, inst, true)
		if err != nil {
			t.Fatal(err)
		}
		lap("pause")
		time.Sleep(100 * time.Millisecond)
		mark = time.Now()
		_ = rs
		inst2, err := n.ResumeFromDisk(ctx, req, p, true, func(*Instance) error { lap("prep"); return nil })
		if err != nil {
			t.Fatal(err)
		}
		lap("restore+healthy")
		inst.Rootfs, inst.Slot = inst2.Rootfs, inst2.Slot
		n.DropCheckpoint(p)
		if round == 3 {
			logs, _ := filepath.Glob("/run/warren-node-test/runsc/sandboxes/xph/*")
			t.Log(logs)
			for _, l := range logs {
				if strings.Contains(l, "restore") || strings.Contains(l, "boot") || strings.Contains(l, "checkpoint") {
					b, _ := os.ReadFile(l)
					os.WriteFile("/tmp/xlog-"+filepath.Base(l), b, 0o644)
				}
			}
		}
		t.Log(strings.Join(laps, " "))
	}
	_ = os.Getpid
}
