package security

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runc runs sandboxes on the host's kernel: serving with it takes an
// explicit --insecure-runtime, and its sandboxes are still confined by a
// seccomp filter and a bounded capability set.
func TestRuncRuntime(t *testing.T) {
	afterCase(t)
	newRunc := func(t *testing.T) *server {
		dir, err := newDataDir(0)
		if err != nil {
			t.Fatal(err)
		}
		v := &server{dataDir: dir, prefix: runcPrefix, cidr: runcCIDR, runDir: runcRunDir, cgroupParent: runcCgroupParent}
		t.Cleanup(func() {
			if !t.Failed() && v.logPath != "" {
				defer os.Remove(v.logPath)
			} else if v.logPath != "" {
				t.Logf("the runc server's log: %s", v.logPath)
			}
			if err := v.stop(); err != nil {
				t.Error(err)
			}
			if err := v.leftovers(); err != nil {
				t.Error(err)
			}
			v.removeRules()
			v.removeDataDir()
		})
		return v
	}
	t.Run("refused without --insecure-runtime", func(t *testing.T) {
		v := newRunc(t)
		err := v.start(S, []string{"--runtime", "runc"})
		if err == nil {
			t.Fatal("warren serve runs runc sandboxes without --insecure-runtime")
		}
		if !strings.Contains(err.Error(), "insecure-runtime") {
			t.Errorf("the refusal does not name --insecure-runtime: %v", err)
		}
	})
	t.Run("hardened with --insecure-runtime", func(t *testing.T) {
		requireFlag(t, "insecure-runtime", "runc mode without seccomp, no_new_privs or a capability bound")
		v := newRunc(t)
		if err := v.start(S, []string{"--runtime", "runc", "--insecure-runtime"}); err != nil {
			t.Fatal(err)
		}
		tm, err := v.defaultTeam()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sb, err := v.createSandbox(ctx, tm, createOpts{})
		if err != nil {
			t.Fatal(err)
		}
		defer killSandbox(t, sb)
		status := sb.ok(t, "user", "cat /proc/self/status")
		fields := map[string]string{}
		for _, l := range strings.Split(status, "\n") {
			if k, val, ok := strings.Cut(l, ":"); ok {
				fields[k] = strings.TrimSpace(val)
			}
		}
		if fields["Seccomp"] != "2" {
			t.Errorf("a runc sandbox's process has no seccomp filter (Seccomp: %q)", fields["Seccomp"])
		}
		bnd, err := strconv.ParseUint(fields["CapBnd"], 16, 64)
		if err != nil {
			t.Fatalf("CapBnd %q: %v", fields["CapBnd"], err)
		}
		for name, bit := range map[string]uint{"CAP_SYS_ADMIN": 21, "CAP_SYS_MODULE": 16, "CAP_SYS_PTRACE": 19, "CAP_NET_ADMIN": 12, "CAP_SYS_RAWIO": 17} {
			if bnd&(1<<bit) != 0 {
				t.Errorf("a runc sandbox's capability bound holds %s", name)
			}
		}
	})
}
