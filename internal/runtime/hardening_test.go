package runtime

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/warren-sandbox/warren/proto/envd/process"
	"github.com/warren-sandbox/warren/proto/envd/process/processconnect"
)

// buildSyscalls builds testdata/syscalls, static.
var buildSyscalls = onceFile(func() (string, error) {
	path := filepath.Join(fixtureDir, "syscalls")
	cmd := exec.Command("go", "build", "-o", path, "./testdata/syscalls")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build testdata/syscalls: %v\n%s", err, out)
	}
	return path, nil
})

// envdSh runs script with sh in the sandbox at ip through envd, as user,
// and returns its combined output and exit code.
func envdSh(t testing.TB, ip, token, user, script string) (string, int) {
	t.Helper()
	c := processconnect.NewProcessClient(httpClient, envdURL(ip))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}})
	req.Header().Set("X-Access-Token", token)
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	stream, err := c.Start(ctx, req)
	if err != nil {
		t.Fatalf("Start %q: %v", script, err)
	}
	defer stream.Close()
	var out strings.Builder
	code := -100
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out.Write(ev.GetData().GetStdout())
		out.Write(ev.GetData().GetStderr())
		if end := ev.GetEnd(); end != nil {
			code = int(end.GetExitCode())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("%q: %v (output %q)", script, err, out.String())
	}
	return out.String(), code
}

// capNumbers maps sandboxCaps to their bit numbers.
var capNumbers = map[string]int{
	"CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE, "CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
	"CAP_FOWNER": unix.CAP_FOWNER, "CAP_FSETID": unix.CAP_FSETID, "CAP_KILL": unix.CAP_KILL, "CAP_MKNOD": unix.CAP_MKNOD,
	"CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "CAP_NET_RAW": unix.CAP_NET_RAW, "CAP_SETFCAP": unix.CAP_SETFCAP,
	"CAP_SETGID": unix.CAP_SETGID, "CAP_SETPCAP": unix.CAP_SETPCAP, "CAP_SETUID": unix.CAP_SETUID, "CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT,
}

// statusCaps reads the Cap* lines of a /proc/<pid>/status.
func statusCaps(t *testing.T, status string) map[string]uint64 {
	t.Helper()
	caps := map[string]uint64{}
	for _, line := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(k, "Cap") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			t.Fatalf("status line %q: %v", line, err)
		}
		caps[k] = n
	}
	return caps
}

// A runc sandbox is hardened like a Docker container: the default seccomp
// profile refuses what the kernel would let an unprivileged root do (new
// user namespaces, the keyring), the capability bounding set is the
// sandbox's set and nothing more, and /proc and /sys hide host knobs.
func TestRuncHardening(t *testing.T) {
	rt := newTestRuntime(t, "runc")
	sb := newSpec(t, "harden")
	helper, err := os.ReadFile(buildSyscalls(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sb.spec.RootFS, "bin", "syscalls"), helper, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Start(ctx, sb.spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), sb.spec.ID) })
	ip, tok := sb.net.sandboxIP, sb.spec.AccessToken
	waitHealthy(t, ip, 10*time.Second)

	t.Run("seccomp", func(t *testing.T) {
		for _, user := range []string{"root", "user"} {
			out, code := envdSh(t, ip, tok, user, "/bin/syscalls")
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if k, v, ok := strings.Cut(line, " "); ok {
					got[k] = v
				}
			}
			want := map[string]string{"clone-newuser": "EPERM", "keyctl": "EPERM", "add_key": "EPERM", "mount": "EPERM", "getpid": "ok"}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("as %s: %s = %q, want %s (exit %d, output %q)", user, k, got[k], v, code, out)
				}
			}
		}
		// unshare(2) itself, from a single-threaded program.
		out, code := envdSh(t, ip, tok, "root", "unshare -U -r true")
		if code == 0 || !strings.Contains(out, "Operation not permitted") {
			t.Errorf("unshare -U: exit %d %q, want EPERM", code, out)
		}
	})

	t.Run("capabilities", func(t *testing.T) {
		var want uint64
		for _, c := range sandboxCaps {
			n, ok := capNumbers[c]
			if !ok {
				t.Fatalf("capNumbers lacks %s", c)
			}
			want |= 1 << n
		}
		for _, pid := range []string{"1", "self"} { // envd, and a process it started
			out, _ := envdSh(t, ip, tok, "root", "cat /proc/"+pid+"/status")
			caps := statusCaps(t, out)
			if caps["CapBnd"] != want || caps["CapEff"] != want || caps["CapPrm"] != want || caps["CapAmb"] != 0 || caps["CapInh"] != 0 {
				t.Errorf("root's %s: %x, want bounding = effective = permitted = %x, no ambient or inheritable", pid, caps, want)
			}
		}
		out, _ := envdSh(t, ip, tok, "user", "cat /proc/self/status")
		if caps := statusCaps(t, out); caps["CapBnd"] != want || caps["CapEff"] != 0 || caps["CapPrm"] != 0 {
			t.Errorf("user: %x, want bounding %x and nothing effective or permitted", caps, want)
		}
	})

	t.Run("proc and sys", func(t *testing.T) {
		// The sandbox's /proc is the host kernel's: what exists on the
		// host exists there, and must be masked. (This machine's kernel,
		// for one, has no /proc/kcore.)
		checked := 0
		for _, p := range maskedPaths {
			fi, err := os.Stat(p)
			if err != nil {
				t.Logf("%s: not on this kernel, nothing to mask", p)
				continue
			}
			script, want := "stat -c %t:%T "+p, "1:3" // /dev/null bound over it
			if fi.IsDir() {
				script, want = "ls -A "+p+" | wc -l", "0" // an empty read-only tmpfs
			}
			if out, _ := envdSh(t, ip, tok, "root", script); strings.TrimSpace(out) != want {
				t.Errorf("%s is not masked: %s gives %q, want %s", p, script, out, want)
			}
			checked++
		}
		if checked == 0 {
			t.Error("no masked path exists on this kernel: the check proves nothing")
		}
		if out, _ := envdSh(t, ip, tok, "root", "wc -c < /proc/interrupts"); strings.TrimSpace(out) != "0" {
			t.Errorf("/proc/interrupts readable: %q bytes", out)
		}
		for _, p := range readonlyPaths {
			if _, err := os.Stat(p); err != nil {
				t.Logf("%s: not on this kernel", p)
				continue
			}
			out, _ := envdSh(t, ip, tok, "root", "grep ' "+p+" ' /proc/self/mounts")
			if f := strings.Fields(out); len(f) < 4 || !strings.HasPrefix(f[3], "ro,") {
				t.Errorf("%s is not mounted read-only: %q", p, out)
			}
		}
		// Writes that would only touch the sandbox (UTS namespace) if
		// they got through.
		for _, script := range []string{
			"echo x > /proc/sys/kernel/domainname && echo written",
			"touch /sys/kernel/x && echo written",
		} {
			if out, _ := envdSh(t, ip, tok, "root", script); strings.Contains(out, "written") || !strings.Contains(out, "Read-only file system") {
				t.Errorf("%s: %q, want it refused as read-only", script, out)
			}
		}
	})
}
