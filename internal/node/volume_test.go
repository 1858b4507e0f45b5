package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/runtime"
)

// TestVolumeMounts mounts one host directory (a volume's tree) into two
// sandboxes at once, at different paths, under each runtime: writes of
// one are seen by the other at once and by the host with the owner the
// sandbox gave them; the mount is nosuid and nodev; a template's link at
// the mount path fails the create instead of moving the mount.
func TestVolumeMounts(t *testing.T) {
	for _, rtName := range []string{"runsc", "runc"} {
		t.Run(rtName, func(t *testing.T) {
			n := testNode(t, rtName)
			vol := t.TempDir()
			if err := os.Chmod(vol, 0o777); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(vol, "from-host"), []byte("host wrote this\n"), 0o644)
			reqA := baseRequest(t, "vol-a-"+rtName)
			reqA.Mounts = []runtime.Mount{{Source: vol, Destination: "/data"}}
			reqB := baseRequest(t, "vol-b-"+rtName)
			reqB.Mounts = []runtime.Mount{{Source: vol, Destination: "/mnt/shared/vol"}}
			a := create(t, n, reqA)
			b := create(t, n, reqB)

			out, code := sh(t, a, "tok-"+a.ID, "user", "cat /data/from-host && echo one > /data/a.txt && mkdir /data/dir && id -u", 10*time.Second)
			if code != 0 || out != "host wrote this\n1000\n" {
				t.Fatalf("writing in A: %d %q", code, out)
			}
			out, code = sh(t, b, "tok-"+b.ID, "user", "cat /mnt/shared/vol/a.txt && echo two >> /mnt/shared/vol/a.txt", 10*time.Second)
			if code != 0 || out != "one\n" {
				t.Errorf("B reading A's write at once: %d %q", code, out)
			}
			out, _ = sh(t, a, "tok-"+a.ID, "user", "cat /data/a.txt", 10*time.Second)
			if out != "one\ntwo\n" {
				t.Errorf("A reading B's append: %q", out)
			}
			for _, name := range []string{"a.txt", "dir"} {
				var st unix.Stat_t
				if err := unix.Lstat(filepath.Join(vol, name), &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
					t.Errorf("%s on the host: uid %d gid %d %v, want what the sandbox gave (1000:1000)", name, st.Uid, st.Gid, err)
				}
			}
			// A setuid-root program in the volume runs without its bit,
			// and a device node made there (the host's memory, which
			// gVisor does not emulate) opens nothing, even for root.
			out, code = sh(t, a, "tok-"+a.ID, "root", "cp /usr/bin/id /data/suid-id && chmod 4755 /data/suid-id && mknod /data/mem c 1 1 2>&1; echo mknod=$?", 10*time.Second)
			if code != 0 {
				t.Fatalf("preparing: %q", out)
			}
			if fi, err := os.Lstat(filepath.Join(vol, "mem")); err == nil {
				t.Logf("the sandbox's mknod left on the host: %v", fi.Mode())
			}
			out, _ = sh(t, a, "tok-"+a.ID, "user", "/data/suid-id -u", 10*time.Second)
			if out != "1000\n" {
				t.Errorf("a setuid program in a volume: %q", out)
			}
			out, _ = sh(t, a, "tok-"+a.ID, "root", "head -c 16 /data/mem > /tmp/mem && echo READ-DEVICE", 10*time.Second)
			if strings.Contains(out, "READ-DEVICE") {
				t.Errorf("a device node in a volume was read: %q", out)
			}
		})
	}
}

// TestVolumeMountOverTemplateLink: a template that has a link where a
// volume is mounted (/data -> /etc) gets no mount through it: the create
// fails, and leaves nothing.
func TestVolumeMountOverTemplateLink(t *testing.T) {
	n := testNode(t, "runsc")
	layer := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(layer, "data")); err != nil {
		t.Fatal(err)
	}
	req := baseRequest(t, "vol-link")
	req.Layers = append(append([]string(nil), req.Layers...), layer)
	req.Mounts = []runtime.Mount{{Source: t.TempDir(), Destination: "/data/x"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := n.Create(ctx, req)
	if err == nil {
		n.Delete(ctx, inst)
		t.Fatal("a volume was mounted through the template's link")
	}
	if !strings.Contains(err.Error(), "/data") {
		t.Errorf("the error does not name the path: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(fixture.store.Dir(), "sandboxes", req.ID)); !os.IsNotExist(serr) {
		t.Errorf("the failed create left its directory: %v", serr)
	}
}
