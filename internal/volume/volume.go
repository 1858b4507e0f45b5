// Package volume keeps team volumes: persistent storage that sandboxes
// mount by name and that the volume content API reads and writes.
//
// A volume is a record in the store (name unique in its team, a token for
// the content API, its quota) and a directory under the volume root
// (--volume-root, default DATA/volumes, 0700):
//
//	<root>/<id>/data          a volume without a quota: a plain directory
//	<root>/<id>/disk.img      a volume with a quota: an ext4 image of that
//	<root>/<id>/fs/           size, its blocks allocated on the host but
//	                          unwritten, mounted here through a loop device
//	<root>/<id>/fs/data       (nosuid, nodev), and its tree
//	<root>/.disks/            a formatted empty image of each size in use,
//	                          copied per volume
//	<root>/.new-<id>          a volume being made; renamed to <id> when whole
//	<root>/.trash-<id>-<r>    a deleted volume being removed
//
// The tree (data/) is what a sandbox sees at its mount path and what the
// content API serves; its root is mode 0777 so that every user of a
// sandbox may write there (E2B's default for what its content API makes).
//
// Why an image per volume: a quota must stop a writer with ENOSPC, in
// the sandbox and through the content API, whatever it writes (sparse
// files and hard links included), and cannot rely on kernel quotas: this
// kernel has no CONFIG_QUOTA (neither ext4 nor XFS project quotas mount),
// and the host's root is plain ext4. A file system of its own per volume
// does all of that, as it does for sandbox disks (internal/rootfs, whose
// loop and sparse-copy code this reuses). The image's blocks are all
// allocated when it is made (fallocate: nothing is written), after the
// node's reserve was asked for them: a writer fills the volume's own file
// system (ENOSPC) and never takes more of the host's disk, so no volume
// write reaches the node's reserve, and a host disk that fills never
// turns into write errors inside a volume. The loop device refuses
// discards, so fstrim does not give the blocks back.
// docs/design/volumes.md has the
// measurements, and the multi-node set-up: a shared --volume-root (NFS)
// holds plain directories only (--volume-quota 0), limited by the file
// server.
//
// Images are mounted when first used (a sandbox mounting the volume, a
// content request) and stay mounted; a restarted warren finds them
// mounted. Sandboxes get the tree as a bind mount (internal/node), so
// several sandboxes share one volume and see each other's writes at once.
//
// Hostile tenants. Everything in a tree was written by sandboxes or
// content requests: the host opens paths in it only through
// internal/rootpath (openat2 RESOLVE_IN_ROOT: no "..", link or magic-link
// escape), reads and writes only regular files (checked on an O_PATH
// descriptor before it is reopened, so a device node or FIFO is never
// opened), and the content API refuses ".." outright. Tokens are compared
// in constant time and open one volume each.
package volume

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/mountinfo"
	"github.com/warren-sandbox/warren/internal/store"
)

// Errors, matched with errors.Is; the API maps them to statuses.
var (
	ErrNotFound     = errors.New("volume not found")
	ErrInvalid      = errors.New("invalid request")
	ErrConflict     = errors.New("conflict")
	ErrInUse        = store.ErrInUse
	ErrTeamLimit    = errors.New("team volume limit reached")
	ErrUnauthorized = errors.New("invalid volume token")
	ErrNoSpace      = errors.New("no space left")
	ErrPathNotFound = errors.New("path not found")
)

// Defaults of Config.
const (
	DefaultQuotaMB    = 10240
	DefaultMaxPerTeam = 100
)

// Config wires a Manager.
type Config struct {
	// Root is the volume root (--volume-root).
	Root string
	// QuotaMB is the size of new volumes' file systems (--volume-quota);
	// 0: plain directories without a limit of their own. Existing volumes
	// keep the quota they were made with.
	QuotaMB int
	// MaxPerTeam bounds a team's volumes; 0: no limit.
	MaxPerTeam int
	// Reserve, if set, is asked before needMB of the host's disk is
	// taken for a volume's image (at create, and at mount for an image
	// not yet wholly allocated); its error, wrapping ErrNoSpace, refuses.
	// The node's disk reserve (--disk-reserve-mb).
	Reserve func(needMB int64) error
	Store   store.VolumeStore
	Logger  *slog.Logger
}

// Manager creates, finds, mounts and deletes volumes. Its methods are
// safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// mounting serialises the mount of each image volume.
	mounting map[string]*sync.Mutex
	// rootSealed is set once the root is known nosuid,nodev.
	rootSealed bool
}

// nfsSuperMagic is statfs's f_type of an NFS mount.
const nfsSuperMagic = 0x6969

// Open returns the manager of the volumes under cfg.Root, creating the
// root (0700; an existing one is made 0700) and removing what a crashed
// run left half-made or half-deleted there.
func Open(cfg Config) (*Manager, error) {
	if cfg.Store == nil {
		return nil, errors.New("volume: Store is required")
	}
	if !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("volume: the volume root %q is not absolute", cfg.Root)
	}
	if cfg.QuotaMB < 0 || cfg.MaxPerTeam < 0 {
		return nil, errors.New("volume: negative quota or team limit")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, mounting: map[string]*sync.Mutex{}}
	if err := m.prepareRoot(); err != nil {
		return nil, err
	}
	m.cleanup()
	return m, nil
}

// prepareRoot makes the root a 0700 directory, refuses a quota on a
// shared (NFS) root, and makes .disks.
func (m *Manager) prepareRoot() error {
	root := m.cfg.Root
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("volume: the volume root %s is not a directory", root)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		// Volumes hold tenants' files (setuid programs among them): no
		// other local user may reach them.
		if err := os.Chmod(root, 0o700); err != nil {
			return fmt.Errorf("volume: making the volume root %s private: %w", root, err)
		}
		m.log.Warn("volume root made private (0700)", "dir", root, "was", fi.Mode().Perm().String())
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	if fs.Type == nfsSuperMagic && m.cfg.QuotaMB > 0 {
		return fmt.Errorf("volume: --volume-quota %d needs a local volume root: %s is on NFS, where an image per volume would be mounted by several nodes at once; use --volume-quota 0 and set quotas on the file server", m.cfg.QuotaMB, root)
	}
	return os.MkdirAll(filepath.Join(root, disksDir), 0o700)
}

// cleanup removes volumes that a crashed run left half-made (.new-*) or
// half-deleted (.trash-*), once they are a minute old: on a shared root
// another node may be making one right now.
func (m *Manager) cleanup() {
	entries, err := os.ReadDir(m.cfg.Root)
	if err != nil {
		m.log.Warn("listing the volume root", "err", err)
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, newPrefix) && !strings.HasPrefix(name, trashPrefix) {
			continue
		}
		if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Minute {
			continue
		}
		if err := removeVolumeDir(filepath.Join(m.cfg.Root, name)); err != nil {
			m.log.Warn("removing a volume a previous run left", "dir", name, "err", err)
		}
	}
}

const (
	disksDir    = ".disks"
	newPrefix   = ".new-"
	trashPrefix = ".trash-"
)

// namePattern is E2B's: letters, digits, '_' and '-'.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,250}$`)

// ValidID reports whether id can name a volume (a UUID, as E2B's).
func ValidID(id string) bool {
	u, err := uuid.Parse(id)
	return err == nil && u.String() == id
}

func (m *Manager) dir(id string) string { return filepath.Join(m.cfg.Root, id) }

// treeOf is where volume v's files are, under its directory dir.
func treeOf(dir string, v store.Volume) string {
	if v.QuotaMB > 0 {
		return filepath.Join(dir, "fs", "data")
	}
	return filepath.Join(dir, "data")
}

// Create makes a volume for a team.
func (m *Manager) Create(ctx context.Context, teamID, name string) (store.Volume, error) {
	if teamID == "" {
		return store.Volume{}, fmt.Errorf("%w: no team", ErrInvalid)
	}
	if !namePattern.MatchString(name) {
		return store.Volume{}, fmt.Errorf("%w: invalid volume name %q: use 1 to 250 letters, digits, '_' and '-'", ErrInvalid, name)
	}
	if _, err := m.cfg.Store.VolumeByName(ctx, teamID, name); err == nil {
		return store.Volume{}, fmt.Errorf("%w: the team has a volume named %q", ErrConflict, name)
	} else if !errors.Is(err, store.ErrNotFound) {
		return store.Volume{}, err
	}
	if m.cfg.MaxPerTeam > 0 {
		// Counted before, not with, the insert: concurrent creates may
		// pass it by a few, which is bound enough.
		have, err := m.cfg.Store.ListVolumes(ctx, teamID)
		if err != nil {
			return store.Volume{}, err
		}
		if len(have) >= m.cfg.MaxPerTeam {
			return store.Volume{}, fmt.Errorf("%w: the team has %d volumes, the most it may have (--max-volumes-per-team); delete one first", ErrTeamLimit, len(have))
		}
	}
	v := store.Volume{ID: uuid.NewString(), TeamID: teamID, Name: name, Token: newToken(), QuotaMB: m.cfg.QuotaMB, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	if err := m.makeStorage(ctx, v); err != nil {
		return store.Volume{}, err
	}
	if err := m.cfg.Store.CreateVolume(ctx, v); err != nil {
		if rerr := removeVolumeDir(m.dir(v.ID)); rerr != nil {
			m.log.ErrorContext(ctx, "removing the storage of a volume that was not recorded", "volume", v.ID, "err", rerr)
		}
		if errors.Is(err, store.ErrConflict) {
			return store.Volume{}, fmt.Errorf("%w: the team has a volume named %q", ErrConflict, name)
		}
		return store.Volume{}, err
	}
	m.log.InfoContext(ctx, "volume created", "volume", v.ID, "team", teamID, "name", name, "quota_mb", v.QuotaMB)
	return v, nil
}

// makeStorage makes v's directory, whole or not at all: it is made under
// a temporary name and renamed into place.
func (m *Manager) makeStorage(ctx context.Context, v store.Volume) (err error) {
	tmp := filepath.Join(m.cfg.Root, newPrefix+v.ID)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := removeVolumeDir(tmp); rerr != nil {
				m.log.ErrorContext(ctx, "removing a half-made volume", "dir", tmp, "err", rerr)
			}
		}
	}()
	if v.QuotaMB > 0 {
		if err := m.makeDisk(ctx, tmp, v.QuotaMB); err != nil {
			return err
		}
	}
	tree := treeOf(tmp, v)
	if err := os.Mkdir(tree, 0o777); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	if err := os.Chmod(tree, 0o777); err != nil { // not masked by the umask
		return fmt.Errorf("volume: %w", err)
	}
	return os.Rename(tmp, m.dir(v.ID))
}

// Get returns a team's volume.
func (m *Manager) Get(ctx context.Context, teamID, id string) (store.Volume, error) {
	if !ValidID(id) {
		return store.Volume{}, fmt.Errorf("%w: invalid volume ID %q", ErrInvalid, id)
	}
	v, err := m.cfg.Store.GetVolume(ctx, teamID, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Volume{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return v, err
}

// Resolve returns a team's volume by name (what a sandbox's volumeMounts
// name).
func (m *Manager) Resolve(ctx context.Context, teamID, name string) (store.Volume, error) {
	v, err := m.cfg.Store.VolumeByName(ctx, teamID, name)
	if errors.Is(err, store.ErrNotFound) {
		return store.Volume{}, fmt.Errorf("%w: the team has no volume named %q", ErrNotFound, name)
	}
	return v, err
}

// List returns a team's volumes.
func (m *Manager) List(ctx context.Context, teamID string) ([]store.Volume, error) {
	return m.cfg.Store.ListVolumes(ctx, teamID)
}

// Delete removes a team's volume and its data, unless a sandbox that is
// not killed mounts it (ErrInUse, as a *store.VolumeInUseError naming
// them). The volume's directory is moved aside while the store deletes
// the record; if that fails it is moved back, so a failed delete leaves
// the volume whole. Its data is removed after.
func (m *Manager) Delete(ctx context.Context, teamID, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%w: invalid volume ID %q", ErrInvalid, id)
	}
	dir := m.dir(id)
	trash := filepath.Join(m.cfg.Root, trashPrefix+id+"-"+newToken()[:8])
	staged := false
	err := m.cfg.Store.DeleteVolume(ctx, teamID, id, func() error {
		if err := os.Rename(dir, trash); err != nil {
			return fmt.Errorf("volume: moving %s aside: %w", id, err)
		}
		staged = true
		return nil
	})
	if err != nil {
		if staged {
			if rerr := os.Rename(trash, dir); rerr != nil {
				m.log.ErrorContext(ctx, "putting back a volume whose deletion failed", "volume", id, "err", rerr)
			}
		}
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return err
	}
	if err := removeVolumeDir(trash); err != nil {
		// The record is gone; Open's cleanup retries the rest.
		m.log.WarnContext(ctx, "removing a deleted volume's data", "volume", id, "err", err)
	}
	m.log.InfoContext(ctx, "volume deleted", "volume", id, "team", teamID)
	return nil
}

// removeVolumeDir removes a volume's directory: its file system, if it
// has one, is shut down (its dirty data dropped) and unmounted first.
func removeVolumeDir(dir string) error {
	shutDownDisk(filepath.Join(dir, "fs"))
	return mountinfo.RemoveTree(dir)
}

// HostDir returns where volume id's files are on this node, its file
// system mounted: the source of a sandbox's bind mount.
func (m *Manager) HostDir(ctx context.Context, id string) (string, error) {
	if !ValidID(id) {
		return "", fmt.Errorf("%w: invalid volume ID %q", ErrInvalid, id)
	}
	v, err := m.cfg.Store.VolumeByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return "", err
	}
	return m.ready(v)
}

// ready mounts v's file system if it has one and is not mounted, and
// returns its tree.
func (m *Manager) ready(v store.Volume) (string, error) {
	dir := m.dir(v.ID)
	if v.QuotaMB > 0 {
		lock := m.mountLock(v.ID)
		lock.Lock()
		defer lock.Unlock()
		if err := m.mountDisk(dir); err != nil {
			return "", err
		}
	}
	if v.QuotaMB == 0 {
		if err := m.sealRoot(); err != nil {
			return "", err
		}
	}
	tree := treeOf(dir, v)
	if fi, err := os.Lstat(tree); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("volume: %s has no data directory (%v)", v.ID, err)
	}
	return tree, nil
}

// sealRoot makes sure the volume root is a nosuid,nodev mount before a
// plain volume is handed out: a sandbox may make device nodes and setuid
// files in its volume (root in a sandbox has CAP_MKNOD), and on the host
// they must open nothing and raise nobody. An image volume's own mount
// has those flags; a plain one is on the root's file system, so the root
// is bind-mounted over itself with them, once (a later run finds the
// flags and mounts nothing).
func (m *Manager) sealRoot() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rootSealed {
		return nil
	}
	root := m.cfg.Root
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	if fs.Flags&unix.ST_NODEV == 0 || fs.Flags&unix.ST_NOSUID == 0 {
		if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("volume: bind-mounting the volume root %s over itself: %w", root, err)
		}
		if err := unix.Mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			_ = unix.Unmount(root, unix.MNT_DETACH)
			return fmt.Errorf("volume: making the volume root %s nosuid,nodev: %w", root, err)
		}
		m.log.Info("volume root mounted nosuid,nodev over itself", "dir", root)
	}
	m.rootSealed = true
	return nil
}

func (m *Manager) mountLock(id string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.mounting[id]
	if l == nil {
		l = &sync.Mutex{}
		m.mounting[id] = l
	}
	return l
}

// Authenticate returns the volume that token opens, if it is volume id's
// token. Whether the volume exists or the token is wrong, the answer is
// the same ErrUnauthorized: a token does not reveal other volumes.
func (m *Manager) Authenticate(ctx context.Context, id, token string) (store.Volume, error) {
	if !ValidID(id) || token == "" {
		return store.Volume{}, ErrUnauthorized
	}
	v, err := m.cfg.Store.VolumeByID(ctx, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return store.Volume{}, err
	}
	// Compared in constant time, and compared at all when there is no
	// such volume, so that the time taken tells nothing either.
	want := v.Token
	if err != nil {
		want = newToken()
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(want)) != 1 || err != nil {
		return store.Volume{}, ErrUnauthorized
	}
	return v, nil
}

// Tree opens volume v's files for the content API; close it after.
func (m *Manager) Tree(v store.Volume) (*Tree, error) {
	dir, err := m.ready(v)
	if err != nil {
		return nil, err
	}
	return OpenTree(dir)
}

// newToken is a volume's content token: 32 random bytes, hex.
func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}
