package volume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/store"
)

// newManager opens a manager over a fresh SQLite store and volume root;
// whatever it mounted is unmounted when the test ends.
func newManager(t testing.TB, quotaMB int) (*Manager, store.Store, string) {
	t.Helper()
	needRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, team := range []string{"team1", "team2"} {
		if err := st.CreateTeam(ctx, store.Team{ID: team, Name: team}); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(dir, "volumes")
	m, err := Open(Config{Root: root, QuotaMB: quotaMB, MaxPerTeam: 3, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mountinfo.RemoveTree(root); err != nil {
			t.Errorf("removing the volume root: %v", err)
		}
	})
	return m, st, root
}

func TestCreateGetListDelete(t *testing.T) {
	ctx := context.Background()
	m, st, root := newManager(t, 0)
	if fi, err := os.Stat(root); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("volume root mode %v %v, want 0700", fi.Mode(), err)
	}
	v, err := m.Create(ctx, "team1", "data")
	if err != nil {
		t.Fatal(err)
	}
	if !ValidID(v.ID) || len(v.Token) != 64 || v.QuotaMB != 0 {
		t.Errorf("created %+v", v)
	}
	for _, name := range []string{"", "a b", "a/b", "..", strings.Repeat("x", 251), "ünï"} {
		if _, err := m.Create(ctx, "team1", name); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v", name, err)
		}
	}
	if _, err := m.Create(ctx, "team1", "data"); !errors.Is(err, ErrConflict) {
		t.Errorf("a taken name: %v", err)
	}
	if _, err := m.Create(ctx, "team2", "data"); err != nil {
		t.Errorf("the same name in another team: %v", err)
	}
	m.Create(ctx, "team1", "b")
	m.Create(ctx, "team1", "c")
	if _, err := m.Create(ctx, "team1", "d"); !errors.Is(err, ErrTeamLimit) {
		t.Errorf("over the team's limit: %v", err)
	}
	if got, err := m.Get(ctx, "team1", v.ID); err != nil || got != v {
		t.Errorf("Get = %+v %v", got, err)
	}
	if _, err := m.Get(ctx, "team2", v.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team's Get: %v", err)
	}
	if _, err := m.Get(ctx, "team1", "../../etc"); !errors.Is(err, ErrInvalid) {
		t.Errorf("a bad ID: %v", err)
	}
	if got, err := m.Resolve(ctx, "team1", "data"); err != nil || got.ID != v.ID {
		t.Errorf("Resolve = %+v %v", got, err)
	}
	if _, err := m.Resolve(ctx, "team1", "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Resolve of nothing: %v", err)
	}
	dir, err := m.HostDir(ctx, v.ID)
	if err != nil || dir != filepath.Join(root, v.ID, "data") {
		t.Fatalf("HostDir = %q %v", dir, err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o777 {
		t.Errorf("a volume's tree is %v, want 0777", fi.Mode())
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil || sfs.Flags&unix.ST_NODEV == 0 || sfs.Flags&unix.ST_NOSUID == 0 {
		t.Errorf("a plain volume is not on a nosuid,nodev mount: flags %#x %v", sfs.Flags, err)
	}
	if _, err := m.HostDir(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if below, _ := mountinfo.Below(root); len(below) != 1 {
		t.Errorf("the volume root is mounted %d times, want once: %v", len(below), below)
	}

	// Tokens open their own volume only.
	if _, err := m.Authenticate(ctx, v.ID, v.Token); err != nil {
		t.Errorf("the right token: %v", err)
	}
	other, _ := m.Resolve(ctx, "team2", "data")
	for _, c := range []struct{ id, token string }{{v.ID, other.Token}, {other.ID, v.Token}, {v.ID, ""}, {v.ID, v.Token + "x"}, {"not-a-uuid", v.Token}} {
		if _, err := m.Authenticate(ctx, c.id, c.token); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Authenticate(%s, wrong token): %v", c.id, err)
		}
	}

	// In use: refused, whole.
	sb := store.Sandbox{ID: "sb1", TeamID: "team1", State: store.StateRunning, VolumeMounts: []store.VolumeMount{{VolumeID: v.ID, Name: "data", Path: "/data"}}}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "keep"), []byte("kept"), 0o644)
	var inUse *store.VolumeInUseError
	if err := m.Delete(ctx, "team1", v.ID); !errors.As(err, &inUse) || !errors.Is(err, ErrInUse) || inUse.SandboxIDs[0] != "sb1" {
		t.Errorf("Delete of a mounted volume: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "keep")); err != nil || string(b) != "kept" {
		t.Errorf("a refused delete touched the data: %q %v", b, err)
	}
	if err := m.Delete(ctx, "team2", v.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team's Delete: %v", err)
	}
	st.DeleteSandbox(ctx, "sb1")
	if err := m.Delete(ctx, "team1", v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted volume's directory: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(root, trashPrefix+"*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if err := m.Delete(ctx, "team1", v.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Delete: %v", err)
	}
}

// TestQuotaVolume checks a volume with a quota: its own ext4, which stops
// writers with ENOSPC (a sparse file's size costs nothing, hard links
// cannot reach outside it), survives a remount with its data, and goes
// with its loop device when deleted.
// newQuotaVolume makes a 64 MB volume of team1 named name on a fresh
// manager and returns them, the volume's tree on the host, its file
// system's mount point and the volume root.
func newQuotaVolume(t *testing.T, name string) (m *Manager, v store.Volume, dir, fs, root string) {
	t.Helper()
	ctx := context.Background()
	m, _, root = newManager(t, 64)
	v, err := m.Create(ctx, "team1", name)
	if err != nil {
		t.Fatal(err)
	}
	if dir, err = m.HostDir(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	return m, v, dir, filepath.Join(root, v.ID, "fs"), root
}

func TestQuotaVolume(t *testing.T) {
	ctx := context.Background()
	m, v, dir, fs, root := newQuotaVolume(t, "q")
	if mounted, _ := isMountPoint(fs); !mounted {
		t.Fatal("the volume's file system is not mounted")
	}
	var sfs unix.Statfs_t
	unix.Statfs(dir, &sfs)
	if size := int64(sfs.Blocks) * sfs.Bsize >> 20; size < 50 || size > 64 {
		t.Errorf("the volume's file system has %d MB, want about 64", size)
	}
	if img, _ := os.Stat(filepath.Join(root, v.ID, "disk.img")); img == nil || diskUsage(t, filepath.Join(root, v.ID, "disk.img")) > 72<<20 {
		t.Errorf("a new 64 MB volume takes more than 72 MB of the host")
	}
	// A sparse file's apparent size is free; real data stops at the quota.
	os.WriteFile(filepath.Join(dir, "sparse"), nil, 0o644)
	if err := os.Truncate(filepath.Join(dir, "sparse"), 1<<40); err != nil {
		t.Errorf("a sparse file: %v", err)
	}
	tree, err := m.Tree(v)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tree.Write("/big", io.LimitReader(zeros{}, 100<<20), Owner{}, false, nil)
	tree.Close()
	if !errors.Is(err, ErrNoSpace) {
		t.Errorf("writing 100 MB into a 64 MB volume: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "big")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write stopped by the quota left its file: %v", err)
	}
	if err := os.Link(filepath.Join(root, disksDir), filepath.Join(dir, "link")); err == nil {
		t.Error("a hard link into the volume from outside its file system")
	}
	os.WriteFile(filepath.Join(dir, "kept"), []byte("kept"), 0o644)

	// A node restart (or reboot): the file system is found mounted, or
	// mounted again, with its data.
	again, err := Open(Config{Root: root, QuotaMB: 64, Store: m.cfg.Store})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := again.HostDir(ctx, v.ID); err != nil || d != dir {
		t.Errorf("HostDir after a restart = %q %v", d, err)
	}
	if below, _ := mountinfo.Below(fs); len(below) != 1 {
		t.Errorf("mounted %d times", len(below))
	}
	if err := unix.Unmount(fs, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := again.HostDir(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "kept")); err != nil || string(b) != "kept" {
		t.Errorf("after a remount: %q %v", b, err)
	}

	backing := filepath.Join(root, v.ID, "disk.img")
	if err := again.Delete(ctx, "team1", v.ID); err != nil {
		t.Fatal(err)
	}
	if below, _ := mountinfo.Below(root); len(below) != 0 {
		t.Errorf("mounts left: %v", below)
	}
	for dev, file := range loopBackings() {
		if strings.HasPrefix(file, root) {
			t.Errorf("loop device %s still holds %s (was %s)", dev, file, backing)
		}
	}
}

func diskUsage(t *testing.T, p string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// loopBackings maps attached loop devices to their backing files.
func loopBackings() map[string]string {
	out := map[string]string{}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			out[f] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// TestFailedDeleteLeavesTheVolume makes the store fail the deletion after
// the volume was moved aside: it is put back, whole.
func TestFailedDeleteLeavesTheVolume(t *testing.T) {
	ctx := context.Background()
	m, st, root := newManager(t, 0)
	v, _ := m.Create(ctx, "team1", "data")
	dir, _ := m.HostDir(ctx, v.ID)
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	boom := errors.New("the database went away")
	m.cfg.Store = failingDelete{VolumeStore: st, err: boom}
	if err := m.Delete(ctx, "team1", v.ID); !errors.Is(err, boom) {
		t.Fatalf("Delete = %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "x" {
		t.Errorf("after a failed delete: %q %v", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(root, trashPrefix+"*")); len(left) > 0 {
		t.Errorf("left aside: %v", left)
	}
	if _, err := st.GetVolume(ctx, "team1", v.ID); err != nil {
		t.Errorf("the record: %v", err)
	}
}

// failingDelete runs the stage, then fails as a database would at commit.
type failingDelete struct {
	store.VolumeStore
	err error
}

func (f failingDelete) DeleteVolume(ctx context.Context, teamID, id string, stage func() error) error {
	if err := stage(); err != nil {
		return err
	}
	return f.err
}

func TestOpenRemovesLeftovers(t *testing.T) {
	m, _, root := newManager(t, 0)
	for _, name := range []string{newPrefix + "x", trashPrefix + "y", newPrefix + "fresh"} {
		os.MkdirAll(filepath.Join(root, name, "data"), 0o700)
	}
	old := unixTime(-2)
	os.Chtimes(filepath.Join(root, newPrefix+"x"), old, old)
	os.Chtimes(filepath.Join(root, trashPrefix+"y"), old, old)
	if _, err := Open(Config{Root: root, Store: m.cfg.Store}); err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(root, ".[nt]*"))
	if len(left) != 1 || filepath.Base(left[0]) != newPrefix+"fresh" {
		t.Errorf("after Open: %v, want only the fresh one (another node may be making it)", left)
	}
}

func unixTime(minutes int) time.Time { return time.Now().Add(time.Duration(minutes) * time.Minute) }

func nowMS() float64 { return float64(time.Now().UnixNano()) / 1e6 }

// A volume's image holds all its blocks on the host from its create on:
// a writer inside it fills its own file system (ENOSPC) and the host's
// disk does not lose a block more, whatever is written or trimmed.
func TestVolumeImageHoldsItsBlocks(t *testing.T) {
	ctx := context.Background()
	m, _, root := newManager(t, 64)
	v, err := m.Create(ctx, "team1", "q")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := m.HostDir(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(root, v.ID, "disk.img")
	held := diskUsage(t, img)
	if held < 64<<20 {
		t.Fatalf("a new 64 MB volume holds %d bytes of the host: writes into it would take the rest from the node's disk", held)
	}
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		_, werr = f.Write(buf)
	}
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	if !errors.Is(werr, unix.ENOSPC) {
		t.Errorf("writing 100 MB into a 64 MB volume: %v, want ENOSPC", werr)
	}
	unix.Sync()
	if now := diskUsage(t, img); now != held {
		t.Errorf("the volume's writes took %d bytes more of the host", now-held)
	}
	// fstrim (the host's weekly timer) gives nothing back either.
	os.Remove(filepath.Join(dir, "fill"))
	unix.Sync()
	fs, err := os.Open(filepath.Join(root, v.ID, "fs"))
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	r := struct{ start, len, minlen uint64 }{0, ^uint64(0), 0}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, fs.Fd(), fitrim, uintptr(unsafe.Pointer(&r)))
	if errno == 0 {
		if now := diskUsage(t, img); now < held {
			t.Errorf("fstrim gave %d bytes of the volume back to the host", held-now)
		}
	}
}

// A volume whose image the node's reserve cannot hold is refused, and
// leaves nothing.
func TestCreateAsksTheReserve(t *testing.T) {
	ctx := context.Background()
	m, st, root := newManager(t, 64)
	var asked int64
	m.cfg.Reserve = func(needMB int64) error {
		asked = needMB
		return fmt.Errorf("%w: the node's disk has 10 MB free above its reserve", ErrNoSpace)
	}
	if _, err := m.Create(ctx, "team1", "q"); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("create beyond the reserve: %v", err)
	}
	if asked != 64 {
		t.Errorf("the reserve was asked for %d MB, want 64", asked)
	}
	if l, _ := st.ListVolumes(ctx, "team1"); len(l) != 0 {
		t.Errorf("recorded %+v", l)
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.Name() != disksDir {
			t.Errorf("left %s in the volume root", e.Name())
		}
	}
}

// fitrim is FITRIM, _IOWR('X', 121, struct fstrim_range).
const fitrim = 0xc0185879
