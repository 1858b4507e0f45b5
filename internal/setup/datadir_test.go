package setup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warren-sandbox/warren/internal/image"
)

// nobodyCanStat tells whether the user nobody can reach p.
func nobodyCanStat(t *testing.T, p string) bool {
	t.Helper()
	cmd := exec.Command("stat", "-c", "%n", p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Permission denied") {
		t.Fatalf("stat %s as nobody: %v: %s", p, err, out)
	}
	return err == nil
}

// TestSecureDataDir: a data dir made 0755 (as Warren used to make it)
// lets local users reach a tenant's setuid program, uploads, snapshots
// and root filesystems; once secured, nothing below it is reachable.
func TestSecureDataDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown, and a check as another user")
	}
	base := t.TempDir()
	// t.TempDir is 0700: open the way to the data dir itself.
	for d := base; d != "/tmp" && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	suid := filepath.Join(s.LayerDir("step-x"), "rootbash")
	paths := []string{suid, filepath.Join(dir, "uploads", "t", "h"), filepath.Join(s.SnapshotDir("snap-x"), "pages.img"),
		filepath.Join(dir, "sandboxes", "sb", "disk.img")}
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Chmod(suid, 0o4755); err != nil {
		t.Fatal(err)
	}
	// The dirs image.Open made are 0700 already; make one as the old
	// code did, to see the data dir's own mode decide.
	if err := os.Chmod(filepath.Join(dir, "layers"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !nobodyCanStat(t, suid) {
		t.Fatal("the test cannot reach the setuid file as nobody even before securing: it would prove nothing")
	}

	changed, err := SecureDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(changed, "mode -rwxr-xr-x -> -rwx------") {
		t.Errorf("changed = %q", changed)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir: %v %v", fi.Mode(), err)
	}
	for _, p := range paths {
		if nobodyCanStat(t, p) {
			t.Errorf("nobody reaches %s", p)
		}
	}
	if changed, err := SecureDataDir(dir); err != nil || changed != "" {
		t.Errorf("second call: %q %v, want no change", changed, err)
	}

	// Another owner is taken away.
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if changed, err := SecureDataDir(dir); err != nil || !strings.Contains(changed, "owner 65534:65534 -> 0:0") {
		t.Errorf("after chown: %q %v", changed, err)
	}
	// Missing: made 0700; not a directory: refused.
	fresh := filepath.Join(base, "fresh", "data")
	if _, err := SecureDataDir(fresh); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("new data dir: %v %v", fi.Mode(), err)
	}
	file := filepath.Join(base, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := SecureDataDir(file); err == nil {
		t.Error("a file was accepted as the data dir")
	}
}
