package security

import (
	"archive/tar"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// hostile is an attack in an archive: its entries, after harmless ones.
type hostile struct {
	name    string
	entries []entry
}

// hostileEntries are archive entries that aim outside the layer or at the
// host's devices; the host paths they aim at are canaries.
func hostileEntries(t *testing.T, tag string) []hostile {
	up := strings.Repeat("../", 12)
	rel := strings.TrimPrefix(S.hostDir, "/")
	escape := S.canaries.plantDir(t, tag+"-escape-dir")
	hardTarget := S.canaries.plant(t, tag+"-hardlink-target")
	return []hostile{
		{"dot-dot", []entry{file(up+rel+"/"+filepath.Base(S.canaries.absent(tag+"-dotdot")), "escaped with ..\n")}},
		{"absolute", []entry{file(S.canaries.absent(tag+"-absolute"), "escaped with an absolute name\n")}},
		{"symlink then a file through it", []entry{
			symlink("escape", escape),
			file("escape/pwned", "written through a symlink\n"),
		}},
		{"hard link out of the layer, then written", []entry{
			{Name: "hard", Type: tar.TypeLink, Link: up + strings.TrimPrefix(hardTarget, "/")},
			file("hard", "written through a hard link\n"),
		}},
		{"character device", []entry{{Name: "kmsg", Type: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 11}}},
		{"block device", []entry{{Name: "disk", Type: tar.TypeBlock, Mode: 0o666, Devmajor: 7, Devminor: 0}}},
	}
}

func TestHostileTarEntriesInCopyUpload(t *testing.T) {
	for _, h := range hostileEntries(t, "copy") {
		name, es := h.name, h.entries
		t.Run(name, func(t *testing.T) {
			afterCase(t)
			all := append([]entry{dir("ctx/"), file("ctx/ok.txt", "fine\n")}, es...)
			rb, r := newRawBuild(t, S.teamA, "sec-copy-"+slug(name), nil)
			if rb == nil {
				t.Fatalf("POST /v3/templates: %s", r)
			}
			hash := sdkFilesHash("ctx", "/srv/ctx/", all)
			if up := rb.upload(t, hash, tarOf(t, all)); up.Status != http.StatusCreated {
				// Refused where it enters: fine, if said clearly.
				checkErrorBody(t, up)
				t.Logf("the upload was refused: %s", up)
				return
			}
			if r := rb.start(t, "base", []step{{Type: "COPY", Args: []string{"ctx", "/srv/ctx/"}, FilesHash: hash}}); r.Status != http.StatusAccepted {
				checkErrorBody(t, r)
				t.Logf("the build was refused: %s", r)
				return
			}
			b := rb.wait(t)
			t.Logf("build: %s; %v", b.Status, b.Err)
			noDeviceNodes(t)
			if b.Err == nil {
				removeLayers(t, ownLayers(t, b.BuildID))
			}
		})
	}
}

func TestHostileTarEntriesInOCILayer(t *testing.T) {
	for _, h := range hostileEntries(t, "oci") {
		name, es := h.name, h.entries
		t.Run(name, func(t *testing.T) {
			afterCase(t)
			archive := ociArchive(t, "root", tarOf(t, append(busyboxLayer(t), es...)))
			out, err := importImage(t, "sec-oci-"+slug(name)+":1", archive)
			t.Logf("import: %v: %s", err, strings.TrimSpace(out))
			noDeviceNodes(t)
		})
	}
}

// noDeviceNodes fails the test if any layer on disk holds a device node
// other than an overlayfs whiteout (character device 0/0), and removes it
// so that later cases start clean.
func noDeviceNodes(t *testing.T) {
	t.Helper()
	root := filepath.Join(S.srv.dataDir, "layers")
	defer filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		var st unix.Stat_t
		if err == nil && d.Type()&(fs.ModeDevice|fs.ModeCharDevice) != 0 && unix.Lstat(p, &st) == nil && st.Rdev != 0 {
			os.Remove(p)
		}
		return nil
	})
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&(fs.ModeDevice|fs.ModeCharDevice) == 0 {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			return nil
		}
		t.Errorf("a device node is in a layer on disk: %s (%s)", strings.TrimPrefix(p, root+"/"), d.Type())
		return nil
	})
}

// A tenant may make setuid files (sudo is one), but they must stay out of
// reach of the host's local users: the data dir is root's alone, and the
// host-side mounts of tenant trees honour neither setuid bits nor device
// nodes, but the container's root itself, where sudo must keep working
// (runc runs it as is), which only the data dir's mode guards.
func TestSetuidFileInLayerIsUnreachableOnHost(t *testing.T) {
	afterCase(t)
	b := linkTemplate(t, S.teamA, "sec-setuid", "cp /bin/dash /usr/local/bin/root-shell && chmod 4755 /usr/local/bin/root-shell")
	if b.Err != nil {
		t.Fatalf("the build failed: %v\n%s", b.Err, b.log())
	}
	var suid string
	for _, l := range ownLayers(t, b.BuildID) {
		p := filepath.Join(S.srv.dataDir, "layers", l, "usr/local/bin/root-shell")
		if fi, err := os.Stat(p); err == nil && fi.Mode()&fs.ModeSetuid != 0 {
			suid = p
		}
	}
	if suid == "" {
		t.Fatal("the build's layer has no setuid root-shell: the test cannot tell")
	}
	if fi, err := os.Stat(S.srv.dataDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the data dir %s is %v, want 0700 (enforced at warren serve start)", S.srv.dataDir, fi.Mode().Perm())
	}
	// A local user (nobody) must not even see the file.
	cmd := exec.Command("/bin/sh", "-c", `test -e "$1" && echo reachable`, "sh", suid)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, _ := cmd.CombinedOutput(); strings.Contains(string(out), "reachable") {
		t.Errorf("a local user (nobody) can reach the tenant's setuid root shell at %s", suid)
	}
	// The witness's root filesystem mounts, as every sandbox's.
	opts := mountOptions(filepath.Join(S.srv.dataDir, "sandboxes", S.witness.ID) + "/")
	if len(opts) == 0 {
		t.Fatalf("no mounts of the witness %s found", S.witness.ID)
	}
	for m, o := range opts {
		if filepath.Base(m) == "rootfs" {
			continue
		}
		if !hasOpt(o, "nosuid") || !hasOpt(o, "nodev") {
			t.Errorf("host-side mount of a tenant tree without nosuid,nodev: %s (%s)", m, o)
		}
	}
}

// slug makes a template or image name of a case's name.
func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else if !strings.HasSuffix(b.String(), "-") {
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-")
}

func hasOpt(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}
